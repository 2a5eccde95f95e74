"""The definition of :mod:`detsample.arith.elementary` composed of torch operations on
float64 tensors: any device, the reference the numba kernels are held to bit for bit
(tests/arith/test_elementary.py).

Each step is one elementwise torch operation (``mul``, ``add``, ``div``, ``where``,
integer and bit operations; the square root is the IEEE one, :func:`sqrt`): one IEEE
rounding per element whatever the kernel's vector width. A scalar divided by a tensor is
spelled as a tensor division (torch's ``k / t`` is ``reciprocal(t) * k``: two roundings,
except for ``k = 1``). No ``addcmul``, ``lerp`` or ``alpha=`` (they may fuse a product
into a sum), and none of the ops the batch-invariant mode overrides (``exp``, ``log``,
``tanh``, ...), so the composition runs unchanged inside the mode. Every function takes and
returns float64 tensors; NaNs come out canonical (``0x7ff8000000000000``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from detsample.arith import elementary as E
from detsample.arith import reference, spec

NAN = float("nan")
INF = float("inf")


def _canonical(y: torch.Tensor) -> torch.Tensor:
    return y.masked_fill_(torch.isnan(y), NAN)


def _estrin(c: tuple[float, ...], p: torch.Tensor) -> torch.Tensor:
    """The definition's ``estrin``: pairs combined level by level, ``p`` squared between."""
    terms: list = list(c)
    while len(terms) > 1:
        nxt = [p * terms[2 * j + 1] + terms[2 * j] for j in range(len(terms) // 2)]
        terms = nxt + (terms[-1:] if len(terms) % 2 else [])
        p = p * p
    return terms[0]


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2**k of an int64 tensor in the float64 normal range."""
    return ((k + spec.F64_EXP_BIAS) << spec.F64_MANT_BITS).view(torch.float64)


def _reduce(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(k as int64, r) of the definition, k = rint(v / ln 2)."""
    t = v * spec.INV_LN2 + spec.SHIFT
    k = t - spec.SHIFT
    r = (v - k * spec.LN2_HI) - k * spec.LN2_LO
    return t.view(torch.int64) - spec.SHIFT_BITS, r


def _clamped(x: torch.Tensor, lo: float) -> torch.Tensor:
    """``min(max(x, lo), EXP_HI)`` with NaN kept (replaced by 0: its result is NaN'd)."""
    return torch.nan_to_num(x, nan=0.0).clamp(lo, E.EXP_HI)


def exp(x: torch.Tensor) -> torch.Tensor:
    """e**x, float64."""
    k, r = _reduce(_clamped(x, E.EXP_LO))
    k1 = k >> 1
    y = (_estrin(spec.EXP_COEFS, r) * _pow2(k1)) * _pow2(k - k1)
    return y.masked_fill_(torch.isnan(x), NAN)


def expm1(x: torch.Tensor) -> torch.Tensor:
    """e**x - 1, float64, without cancellation near 0."""
    k, r = _reduce(_clamped(x, E.EXPM1_LO))
    q = r + (r * r) * _estrin(E.EXPM1_COEFS, r)
    h = _pow2(k - 1)
    y = ((q * h) + (h - 0.5)) * 2.0
    y = torch.where(k == 0, q, y)
    y = torch.where(x == 0, x, y)
    return y.masked_fill_(torch.isnan(x), NAN)


def tanh(x: torch.Tensor) -> torch.Tensor:
    s = x.abs().clamp_(max=E.TANH_BIG)
    t = expm1(s * 2.0)
    return _canonical(torch.copysign(t / (t + 2.0), x))


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return _canonical(1.0 / (exp(-x) + 1.0))


def silu(x: torch.Tensor) -> torch.Tensor:
    return _canonical(x / (exp(-x) + 1.0))


def softplus(x: torch.Tensor, beta: float, threshold: float) -> torch.Tensor:
    z = x * beta
    u = exp(z)
    w = u + 1.0
    lp = reference.log64(w) * (u / (w - 1.0))
    lp = torch.where((w == 1.0) | (u == INF), u, lp)
    return _canonical(torch.where(z > threshold, x, lp / beta))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    y = ((x * x) * x * E.GELU_KAPPA + x) * E.SQRT_2_OVER_PI
    return _canonical(x / (exp(y * -2.0) + 1.0))


def _phi(v: torch.Tensor) -> torch.Tensor:
    return exp((v * v) * -0.5) * E.INV_SQRT_2PI


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    """x Phi(x): the series for |x| <= PHI_SERIES_MAX, Mills' ratio's Taylor series to
    MILLS_MAX, the continued fraction beyond."""
    a = x.abs()
    central = _phi(x) * (x * _estrin(E.PHI_SERIES, x * x)) + 0.5
    mills = _phi(a) * _estrin(E.MILLS_COEFS, a - E.MILLS_CENTER)
    t = a.clone()
    for k in range(E.PHI_CF_TERMS, 0, -1):
        t = torch.full_like(a, float(k)).div_(t).add_(a)  # not k / t: torch's reciprocal * k
    Q = torch.where(a <= E.MILLS_MAX, mills, _phi(a) / t)
    tail = torch.where(x < 0, Q, 1.0 - Q)
    return _canonical(x * torch.where(a <= E.PHI_SERIES_MAX, central, tail))


def _ieee_sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root. torch's CPU ``sqrt`` is not (MKL's vector math:
    measured, ~1% of float64 and ~15% of float32 results 1 ulp off), so CPU tensors take
    numpy's (the IEEE instruction); other devices torch's (IEEE on CUDA)."""
    if x.device.type == "cpu":
        with np.errstate(invalid="ignore"):
            return torch.from_numpy(np.sqrt(x.contiguous().numpy()))
    return torch.sqrt(x)


def sqrt(x: torch.Tensor) -> torch.Tensor:
    return _canonical(_ieee_sqrt(x))


def rsqrt(x: torch.Tensor) -> torch.Tensor:
    return _canonical(1.0 / _ieee_sqrt(x))


def pow_int(x: torch.Tensor, n: int) -> torch.Tensor:
    """x**n by square-and-multiply (n an integer, |n| < POW_INT_MAX)."""
    m = abs(n)
    y = torch.ones_like(x)
    b = x
    while m:
        if m & 1:
            y = y * b
        m >>= 1
        if m:
            b = b * b
    return _canonical(1.0 / y if n < 0 else y)


def pow_general(x: torch.Tensor, e: float, odd: bool) -> torch.Tensor:
    """x**e, e neither +-0.5 nor a small integer (``odd``: an odd integer)."""
    m = x.abs()
    ok = (m > 0) & (m < INF)
    a = exp(reference.log64(torch.where(ok, m, 1.0)) * e)
    edge = torch.where(m == 0, 0.0 if e > 0 else INF, INF if e > 0 else 0.0)
    a = torch.where(ok, a, edge)
    if odd:
        neg = -a
    elif float(e).is_integer() or math.isinf(e):
        neg = a
    else:
        neg = torch.where(m == INF, a, NAN)
    y = torch.where(x < 0, neg, a)
    if e != e:
        return torch.full_like(y, NAN)
    return y.masked_fill_(torch.isnan(x), NAN)
