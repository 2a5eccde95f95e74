"""The definition of :mod:`detsample.arith.trig` (``cos`` / ``sin``) composed of torch
operations on float64 and int64 tensors: any device, the reference the numba kernels
are held to bit for bit (tests/arith/test_trig.py). One elementwise operation per step
(the conventions of :mod:`detsample.arith.elementary_torch`); the Payne-Hanek reduction
runs on the elements beyond ``CW_MAX`` only, in exact int64 arithmetic.
"""

from __future__ import annotations

import torch

from detsample.arith import trig

NAN = float("nan")


def _limbs(device: torch.device) -> torch.Tensor:
    return torch.tensor(trig.TWO_OVER_PI_LIMBS, dtype=torch.int64, device=device)


def _window_limb(table: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The 24 bits of 2/pi at positions ``pos + 1 .. pos + 24`` (int64 tensors)."""
    p = pos + trig.PAD_LIMBS * trig.LIMB
    i = torch.div(p, trig.LIMB, rounding_mode="floor")
    b = p - i * trig.LIMB
    both = (table[i] << trig.LIMB) | table[i + 1]
    return (both >> (trig.LIMB - b)) & trig.LIMB_MASK


def payne_hanek(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n, r)`` of finite float64 ``a > CW_MAX``: quadrant (int64, before ``& 3``) and
    reduced argument."""
    bits = a.view(torch.int64)
    e = (bits >> trig.F64_MANT_BITS) - (trig.F64_EXP_BIAS + trig.F64_MANT_BITS)
    m = (bits & trig.F64_MANT_MASK) | (1 << trig.F64_MANT_BITS)
    ms = [m & trig.LIMB_MASK, (m >> trig.LIMB) & trig.LIMB_MASK, m >> (2 * trig.LIMB)]
    table = _limbs(a.device)
    start = e - (trig.WINDOW_LEAD + 1)
    c = [_window_limb(table, start + trig.LIMB * j) for j in range(trig.G_LIMBS)]
    acc = []
    for q in range(trig.G_LIMBS):
        s = torch.zeros_like(m)
        for k in range(trig.M_LIMBS):
            if q + k < trig.G_LIMBS:
                s = s + ms[k] * c[q + k]
        acc.append(s)
    for q in range(trig.G_LIMBS - 1, 0, -1):
        acc[q - 1] = acc[q - 1] + (acc[q] >> trig.LIMB)
        acc[q] = acc[q] & trig.LIMB_MASK
    n = acc[0] & 3
    neg = acc[1] >= (1 << (trig.LIMB - 1))
    carry = torch.ones_like(m)
    for q in range(trig.G_LIMBS - 1, 0, -1):
        v = (trig.LIMB_MASK - acc[q]) + carry
        carry = v >> trig.LIMB
        acc[q] = torch.where(neg, v & trig.LIMB_MASK, acc[q])
    n = n + neg.to(torch.int64)
    g1 = ((acc[1] << trig.LIMB) | acc[2]).to(torch.float64)
    g2 = ((acc[3] << trig.LIMB) | acc[4]).to(torch.float64)
    g3 = ((acc[5] << trig.LIMB) | acc[6]).to(torch.float64)
    g4 = acc[7].to(torch.float64)
    s = ((g1 * 2.0**-48 + g2 * 2.0**-96) + g3 * 2.0**-144) + g4 * 2.0**-168
    r = s * trig.PIO2
    return n, torch.where(neg, -r, r)


def reduce(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n, r)`` of finite float64 ``x``: ``x = n pi/2 + r``, n in 0..3 (int64)."""
    t = x * trig.INV_PIO2 + trig.SHIFT
    k = t - trig.SHIFT
    n = (t.view(torch.int64) - trig.SHIFT_BITS) & 3
    r = (((x - k * trig.P1) - k * trig.P2) - k * trig.P3) - k * trig.P3T
    big = x.abs() > trig.CW_MAX
    if bool(big.any()):
        xb = x[big]
        nb, rb = payne_hanek(xb.abs())
        neg = xb < 0
        n[big] = torch.where(neg, -nb, nb) & 3
        r[big] = torch.where(neg, -rb, rb)
    return n, r


def _sincos(x: torch.Tensor, want_sin: bool) -> torch.Tensor:
    ok = torch.isfinite(x)
    n, r = reduce(torch.where(ok, x, 0.0))
    w = r * r
    S = torch.full_like(w, trig.SIN_COEFS[trig.POLY_DEGREE])
    for j in range(trig.POLY_DEGREE - 1, 0, -1):
        S = S * w + trig.SIN_COEFS[j]
    s = r + (r * w) * S
    Cp = torch.full_like(w, trig.COS_COEFS[trig.POLY_DEGREE])
    for j in range(trig.POLY_DEGREE - 1, 1, -1):
        Cp = Cp * w + trig.COS_COEFS[j]
    c = 1.0 - (w * 0.5 - (w * w) * Cp)
    if not want_sin:
        n = (n + 1) & 3
    y = torch.where(n == 0, s, torch.where(n == 1, c, torch.where(n == 2, -s, -c)))
    if want_sin:
        y = torch.where(x == 0, x, y)
    return y.masked_fill_(~ok, NAN)


def sin(x: torch.Tensor) -> torch.Tensor:
    """sin of a float64 tensor, float64."""
    return _sincos(x, True)


def cos(x: torch.Tensor) -> torch.Tensor:
    """cos of a float64 tensor, float64."""
    return _sincos(x, False)
