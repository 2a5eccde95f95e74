"""The Triton sampler backend: the kernel twins of the torch ops, under the torch names.

``Sampler(backend="triton")`` (and ``"auto"`` on CUDA tensors) calls these instead of
:mod:`detsample.ops` and :mod:`detsample.rng`; every function keeps the contract of its
torch twin (shapes, dtypes, -inf conventions), so the sampler only swaps the callee.

* ``sanitize_rows`` (:mod:`detsample.ops.sanitize`), ``scale_logits``
  (:mod:`detsample.ops.temperature`), ``row_uniforms`` (:mod:`detsample.rng`): the same
  bits as the torch twin (exact operations; Philox bits);
* ``thresholds_and_draw`` (the sampler's steps 8-9, :mod:`detsample.ops.filters` and
  :mod:`detsample.ops.draw`): the same kept sets and tokens outside near-ties;
* ``log_softmax_rows`` (:mod:`detsample.ops.logprobs`) and ``exp`` (``torch.exp``):
  within a stated bound.

"Outside near-ties": kept sets and tokens equal the torch backend's unless the oracle's
decision margin is below :data:`detsample.kernels.NEAR_TIE_MARGIN` (docs/gpu.md),
because ``exp`` (hence a mass ``q``) may differ by an ulp between implementations.
Within the Triton backend every step is bitwise batch-invariant and run-to-run reproducible.
"""

from __future__ import annotations

from detsample.kernels.common import check_device, interpreted
from detsample.kernels.filters import thresholds_and_draw
from detsample.kernels.logprobs import exp, log_softmax_rows
from detsample.kernels.prepare import sanitize_rows, scale_logits
from detsample.kernels.rng import row_uniforms

__all__ = ["check_device", "exp", "interpreted", "log_softmax_rows", "row_uniforms",
           "sanitize_rows", "scale_logits", "thresholds_and_draw"]
