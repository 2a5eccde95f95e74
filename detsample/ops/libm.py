"""MKL-free ``exp``, ``log``, ``tanh`` and ``expm1``: detsample's defined functions
(:mod:`detsample.arith.pointwise`), the same bits on every CPU, ISA, MKL instruction level
and torch build.

Why: on x86 torch computes ``exp``, ``log``, ``log2`` and ``tanh`` with MKL's vector math
library, whose bits change with ``MKL_ENABLE_INSTRUCTIONS``, and its other kernels (Sleef)
with ATen's instruction set. These functions are the definitions of
:mod:`detsample.arith.elementary` and :mod:`detsample.arith.spec` (float64 polynomials of
IEEE operations, no FMA, rounded once to the input's dtype); they were compositions of
ATen's ``exp2`` / ``log1p`` / ``expm1``, whose bits followed ATen's ISA.

Accuracy: float32 results are the correctly rounded value except at rare near-ties (1 ulp
at most; tests/ops/test_libm.py compares with numpy). Specials: NaN -> the canonical NaN;
``exp(-inf) = 0``, ``exp(inf) = inf``; ``expm1(-inf) = -1``, ``expm1(-0) = -0``;
``log(0) = -inf``, ``log(x < 0) = NaN``, ``log(inf) = inf``; ``tanh(-0) = -0``.

Inputs: floating tensors of any shape; outputs in the input's dtype.
"""

from __future__ import annotations

import torch

from detsample.arith import pointwise


def exp(x: torch.Tensor) -> torch.Tensor:
    """``exp``: detsample's (Estrin polynomial in float64, rounded once)."""
    return pointwise.exp(x)


def log(x: torch.Tensor) -> torch.Tensor:
    """Natural ``log``: detsample's ``log64``, rounded once."""
    return pointwise.log(x)


def tanh(x: torch.Tensor) -> torch.Tensor:
    """``tanh``: ``t / (t + 2)``, ``t = expm1(2|x|)``, with ``x``'s sign."""
    return pointwise.tanh(x)


def expm1(x: torch.Tensor) -> torch.Tensor:
    """``exp(x) - 1`` without cancellation."""
    return pointwise.expm1(x)
