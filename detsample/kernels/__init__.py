"""Triton twins of the sampler's hot steps and of the batch-invariant mode's ops.

Every kernel here is a pure function of its tensor arguments: no state, no I/O, no
environment reads, one program per row (or per fixed output tile) so that a row's bits
never depend on the batch around it. The submodules import ``triton``; this package
itself does not, so ``import detsample`` stays cheap where triton is absent.

On CUDA tensors the kernels are compiled; on CPU tensors they run only under the Triton
interpreter (``TRITON_INTERPRET=1`` set before ``triton`` is first imported), which is
how the test suite exercises them. docs/gpu.md says what holds where.
"""

from __future__ import annotations

import importlib.util

#: Bound on the relative difference of two float32 ``exp`` implementations that the
#: backends run (torch's CPU exp, numpy's in the interpreter, ``tl.exp`` on CUDA) over
#: z in [-87, 0]: 2 ulp, plus CUDA's rounding of ``z * log2(e)`` before ``ex2.approx``
#: (half an ulp of 128, times ln 2: 2.6e-6 ... 5.3e-6 at the far end). Measured by
#: tests/kernels/test_logprobs.py (interpreter) and the gpu tests.
EXP_REL_ERR = 6e-6
#: Near-tie margin, in the units of ``oracles/sampler.py``'s ``margin`` (the closest
#: decision's distance from its threshold: relative to the mass for top-p and the draw,
#: absolute in exp for min-p). Wherever the margin exceeds it, the Triton and torch
#: backends keep the same set and draw the same token on any device: a discrepancy of
#: EXP_REL_ERR in every mass moves a decision by at most 2 * EXP_REL_ERR, 8x less.
#: Top-k decisions compare the scaled logits, which are bit-identical on every device.
NEAR_TIE_MARGIN = 1e-4
#: |Triton log_softmax - torch log_softmax| <= LOGPROB_ABS + LOGPROB_REL * |value|
LOGPROB_ABS, LOGPROB_REL = 2e-5, 5e-7


def available() -> bool:
    """True when the ``triton`` package can be imported (nothing is imported here)."""
    return importlib.util.find_spec("triton") is not None
