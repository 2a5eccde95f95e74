"""Triton twins of the sampler's hot steps and of the batch-invariant mode's ops.

Every kernel here is a pure function of its tensor arguments: no state, no I/O, no
environment reads, one program per row (or per fixed output tile) so that a row's bits
never depend on the batch around it. The submodules import ``triton``; this package
itself does not, so ``import detsample`` stays cheap where triton is absent.

Every ``exp`` and ``log`` whose result reaches a sampler output or decision is
detsample's own (:mod:`detsample.arith`, spelled in :mod:`detsample.kernels.common`),
so the sampler's kernels give the torch backend's bits -- no tolerance, no near-tie
margin -- wherever float64 ``+ - * /`` and conversions round as IEEE and nothing is
contracted (every launch: ``enable_fp_fusion=False``).

On CUDA tensors the kernels are compiled; on CPU tensors they run only under the Triton
interpreter (``TRITON_INTERPRET=1`` set before ``triton`` is first imported), which is
how the test suite exercises them. docs/gpu.md says what holds where.
"""

from __future__ import annotations

import importlib.util


def available() -> bool:
    """True when the ``triton`` package can be imported (nothing is imported here)."""
    return importlib.util.find_spec("triton") is not None
