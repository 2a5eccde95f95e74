"""MKL-free ``exp``, ``log``, ``tanh`` and ``expm1``: the same bits on every MKL instruction level.

Why: on x86 torch computes ``exp``, ``log``, ``log2`` and ``tanh`` (float32 and float64)
with MKL's vector math library, whose bits change with ``MKL_ENABLE_INSTRUCTIONS``
(SSE4.2, AVX2 and AVX-512 give different results for the same input; measured, see
docs/batch-invariant.md). Used by the batch-invariant mode's portable kernels and by the
sampler's "processed" logprob normaliser. ``exp2``, ``expm1`` and ``log1p`` are ATen's own vectorised
(Sleef) kernels, whose bits depend on ATen's instruction set and torch's version only,
the two facts the golden fingerprint names. These functions are built from those three
in float64, plus IEEE operations (multiplication, ``frexp``, division), run through
:func:`detsample.ops.vector.pointwise` so every element takes the vector loop:

* ``exp(x) = float32(exp2(float64(x) * log2(e)))``;
* ``log(x) = float32(e * ln2 + log1p(m - 1))`` with ``x = m * 2**e``, ``m`` in
  [sqrt(1/2), sqrt(2)) (``m - 1`` is exact);
* ``tanh(x) = float32(t / (t + 2))`` with ``t = expm1(2|x|)``, the sign of ``x``
  (``tanh(-0) = -0``), ``|x|`` clamped to 20 (where it is +-1 in float64);
* ``expm1(x) = float32(expm1(float64(x)))`` (the float32 kernel's bits would follow the
  vector width of ATen's build; the float64 one, rounded once, is the correctly rounded
  float32 value but at rare ties).

Accuracy: the float64 value is within a few float64 ulps of the true one, so the float32
result is the correctly rounded value except at inputs within ~1e-15 of a float32
rounding tie (1 ulp at most; tests/ops/test_libm.py compares with numpy).
Specials: NaN -> NaN; ``exp(-inf) = 0``, ``exp(inf) = inf``; ``expm1(-inf) = -1``, ``expm1(-0) = -0``; ``log(0) = -inf``,
``log(x < 0) = NaN``, ``log(inf) = inf``.

Inputs: floating tensors of any shape; outputs float32 (float64 for a float64 input).
"""

from __future__ import annotations

import torch

from detsample.ops.vector import pointwise

aten = torch.ops.aten

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
SQRT_HALF = 0.7071067811865476
TANH_BIG = 20.0        # |x| beyond: tanh(x) = +-1 in float64


def _f64(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.to(torch.float64)


def _out(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return y if x.dtype == torch.float64 else y.to(torch.float32)


def exp(x: torch.Tensor) -> torch.Tensor:
    """``exp`` without MKL: ``exp2(x * log2(e))`` in float64."""
    return _out(pointwise(aten.exp2.out, _f64(x) * LOG2E), x)


def log(x: torch.Tensor) -> torch.Tensor:
    """Natural ``log`` without MKL: ``e ln2 + log1p(m - 1)`` in float64."""
    xd = _f64(x)
    ok = torch.isfinite(xd) & (xd > 0)
    m, e = torch.frexp(torch.where(ok, xd, 1.0))
    low = m < SQRT_HALF
    m = torch.where(low, m * 2.0, m)
    e = (e - low.to(e.dtype)).to(torch.float64)
    y = pointwise(aten.log1p.out, m - 1.0).add_(e * LN2)
    if not bool(ok.all()):
        fill = torch.where(xd == 0, float("-inf"),
                           torch.where(xd == float("inf"), float("inf"), float("nan")))
        y = torch.where(ok, y, fill)
    return _out(y, x)


def tanh(x: torch.Tensor) -> torch.Tensor:
    """``tanh`` without MKL: ``t / (t + 2)``, ``t = expm1(2|x|)``, with ``x``'s sign."""
    xd = _f64(x)
    t = pointwise(aten.expm1.out, xd.abs().clamp_(max=TANH_BIG) * 2.0)
    return _out(torch.copysign(t / (t + 2.0), xd), x)


def expm1(x: torch.Tensor) -> torch.Tensor:
    """``exp(x) - 1`` without MKL and without cancellation: ATen's ``expm1`` in float64."""
    return _out(pointwise(aten.expm1.out, _f64(x)), x)
