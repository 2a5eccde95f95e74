"""The Triton sampler backend: the kernel twins of the torch ops, under the torch names.

``Sampler(backend="triton")`` (and ``"auto"`` on CUDA tensors) calls these instead of
:mod:`detsample.ops` and :mod:`detsample.rng`; every function keeps the contract of its
torch twin (shapes, dtypes, -inf conventions) and gives its bits, so the sampler only
swaps the callee:

* ``sanitize_rows`` (:mod:`detsample.ops.sanitize`), ``scale_logits``
  (:mod:`detsample.ops.temperature`), ``row_uniforms`` (:mod:`detsample.rng`): exact
  operations; Philox bits;
* ``thresholds_and_draw`` (the sampler's steps 8-9, :mod:`detsample.ops.filters` and
  :mod:`detsample.ops.draw`): the same kept sets, exact masses and tokens, the masses'
  ``exp`` being detsample's (:func:`detsample.kernels.common.exp32`);
* ``log_softmax_rows``, ``normalisers_rows`` and ``exp``: :func:`detsample.arith.log_softmax`,
  :func:`detsample.arith.normalisers` and :func:`detsample.arith.exp`, bit for bit.

Those bits are the torch backend's (detsample.arith's definition) wherever float64
``+ - * /`` and conversions round as IEEE and nothing is contracted: the interpreter
(numpy) by test (tests/kernels), a GPU by ``ci/gpu-check.sh`` (docs/gpu.md). Within the
Triton backend every step is bitwise batch-invariant and run-to-run reproducible.
"""

from __future__ import annotations

from detsample.kernels.common import check_device, interpreted
from detsample.kernels.filters import thresholds_and_draw
from detsample.kernels.logprobs import exp, log_softmax_rows, normalisers_rows
from detsample.kernels.prepare import sanitize_rows, scale_logits
from detsample.kernels.rng import row_uniforms

__all__ = [
    "check_device",
    "exp",
    "interpreted",
    "log_softmax_rows",
    "normalisers_rows",
    "row_uniforms",
    "sanitize_rows",
    "scale_logits",
    "thresholds_and_draw",
]
