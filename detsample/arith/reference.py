"""The definition of :mod:`detsample.arith.spec` composed of torch operations: any device,
the reference every faster form is held to, bit for bit (tests/arith).

Each step is one elementwise torch operation on float64 (or int64) tensors: a float64
``mul`` or ``add`` kernel rounds each element once whatever its vector width, so the
composition is the definition's sequence of IEEE operations on every CPU and GPU. (No
``torch.add(..., alpha=)``, ``addcmul`` or ``lerp``: those may fuse a product into a sum.)
Slow -- about 25 float64 passes over the input -- which is why the CPU has
:mod:`detsample.arith.cpu`.
"""

from __future__ import annotations

import torch

from detsample.arith import spec

NAN32 = float("nan")  # written into float32 tensors as 0x7fc00000 (tests/arith)


def exp64(x: torch.Tensor) -> torch.Tensor:
    """exp of a float64 tensor (any shape, device), rounded to float32: the definition."""
    if x.dtype != torch.float64:
        raise TypeError(f"exp64 takes float64, got {x.dtype}")
    C = spec.EXP_COEFS
    v = x.clamp(spec.EXP_LO, spec.EXP_HI)
    t = v * spec.INV_LN2
    t.add_(spec.SHIFT)
    k = t - spec.SHIFT
    r = v.sub_(k * spec.LN2_HI)
    r.sub_(k.mul_(spec.LN2_LO))
    r2 = r * r
    r4 = r2 * r2
    r8 = r4 * r4
    a = [r * C[2 * j + 1] + C[2 * j] for j in range(6)]
    b0 = a[1].mul_(r2).add_(a[0])
    b1 = a[3].mul_(r2).add_(a[2])
    b2 = a[5].mul_(r2).add_(a[4])
    d0 = b1.mul_(r4).add_(b0)
    d1 = (r4 * C[12]).add_(b2)
    p = d1.mul_(r8).add_(d0)
    scale = t.view(torch.int64).sub_(spec.SHIFT_BITS - spec.F64_EXP_BIAS)
    p.mul_(scale.bitwise_left_shift_(spec.F64_MANT_BITS).view(torch.float64))
    return _canonical(p.to(torch.float32), torch.isnan(x))


def exp32(z: torch.Tensor) -> torch.Tensor:
    """exp of a float32 tensor: :func:`exp64` of its (exact) float64 values."""
    if z.dtype != torch.float32:
        raise TypeError(f"exp32 takes float32, got {z.dtype}")
    return exp64(z.to(torch.float64))


def log64(x: torch.Tensor) -> torch.Tensor:
    """Natural log of a float64 tensor: float64, the definition's bits."""
    if x.dtype != torch.float64:
        raise TypeError(f"log64 takes float64, got {x.dtype}")
    ok = torch.isfinite(x) & (x > 0)
    v = torch.where(ok, x, 1.0)
    sub = v < spec.F64_MIN_NORMAL
    v = torch.where(sub, v * spec.SUBNORMAL_SCALE, v)
    bits = v.view(torch.int64)
    e = (bits >> spec.F64_MANT_BITS) - (spec.F64_EXP_BIAS - 1)  # v = m 2**e, m in [1/2, 1)
    mant = (bits & ((1 << spec.F64_MANT_BITS) - 1)) | ((spec.F64_EXP_BIAS - 1) << spec.F64_MANT_BITS)
    m = mant.view(torch.float64)
    low = m < spec.SQRT_HALF
    m = torch.where(low, m * 2.0, m)
    e = e - low.to(torch.int64) - sub.to(torch.int64) * spec.SUBNORMAL_EXP
    f = m - 1.0
    s = f / (f + 2.0)
    w = s * s
    R = torch.full_like(w, spec.LOG_COEFS[spec.LOG_TERMS])
    for c in reversed(spec.LOG_COEFS[1 : spec.LOG_TERMS]):
        R.mul_(w).add_(c)
    ef = e.to(torch.float64)
    y = (s + s * (w * R)) * 2.0 + ef * spec.LN2_LO
    y = ef * spec.LN2_HI + y
    if bool(ok.all()):
        return y
    fill = torch.where(x == 0, float("-inf"), torch.where(x == float("inf"), float("inf"), float("nan")))
    return torch.where(ok, y, fill)


def fixed_sum(e: torch.Tensor, frac: int) -> torch.Tensor:
    """The exact two-word sum of the definition over the last dim: e (..., n) float32 in
    [0, 1] -> (...,) float64 ``S``."""
    scale = 2.0**frac
    w = e.to(torch.float64) * scale
    h = w.to(torch.int64)
    lo = (w - h.to(torch.float64)).mul_(scale).to(torch.int64)
    H, L = h.sum(-1), lo.sum(-1)
    return (H.to(torch.float64) + L.to(torch.float64) * (1.0 / scale)) * (1.0 / scale)


def normalisers(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m, G)`` over the last dim of a float32 tensor (..., n): the row maxima (float32)
    and the log-normalisers ``G = log64(S)`` (float64; NaN for a row whose log_softmax is
    all NaN: a NaN or +inf in it, or no finite value)."""
    if x.dtype != torch.float32:
        raise TypeError(f"normalisers take float32, got {x.dtype}")
    m = torch.amax(x, dim=-1)
    bad = ~torch.isfinite(m) | torch.isnan(x).any(-1)
    ms = torch.where(bad, 0.0, m).unsqueeze(-1)
    d = x.to(torch.float64) - ms.to(torch.float64)
    G = log64(fixed_sum(exp64(d), spec.frac_bits(x.shape[-1])))
    return m, G.masked_fill_(bad, float("nan"))


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    """log_softmax over the last dim of a float32 tensor (..., n): float32, the
    definition's bits (a row with a NaN, a +inf or no finite value: NaN32)."""
    if x.numel() == 0:
        return x.to(torch.float32, copy=True)
    m, G = normalisers(x)
    return picked(x, m.unsqueeze(-1), G.unsqueeze(-1))


def picked(x: torch.Tensor, m: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """``float32((float64(x) - float64(m)) - G)`` with NaN32 where ``G`` is NaN: the
    log_softmax values of entries ``x`` (float32) of rows with maxima ``m`` (float32)
    and normalisers ``G`` (float64), broadcast."""
    y = ((x.to(torch.float64) - m.to(torch.float64)) - G).to(torch.float32)
    return _canonical(y, torch.isnan(G).expand_as(y))


def _canonical(y: torch.Tensor, nan: torch.Tensor) -> torch.Tensor:
    """``y`` with NaN32 where ``nan`` (and wherever ``y`` is NaN: one NaN pattern)."""
    return y.masked_fill_(nan | torch.isnan(y), NAN32)
