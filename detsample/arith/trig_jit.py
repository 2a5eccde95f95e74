"""The numba kernels of :mod:`detsample.arith.trig` (``cos`` / ``sin``): the definition
spelled as scalar code, compiled without fast-math (no contraction); imported on first
use by :mod:`detsample.arith.pointwise`.
"""

from __future__ import annotations

import numba
import numpy as np

from detsample.arith import trig
from detsample.arith.jit import bits_of

_jit = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)
LIMBS = np.array(trig.TWO_OVER_PI_LIMBS, dtype=np.int64)
SC = np.array(trig.SIN_COEFS)
CC = np.array(trig.COS_COEFS)
MASK = trig.LIMB_MASK
TOP = 1 << (trig.LIMB - 1)


@numba.njit(inline="always", **_jit)
def _window_limb(pos):
    """The 24 bits of 2/pi at positions ``pos + 1 .. pos + 24`` (``pos >= -72``)."""
    p = pos + trig.PAD_LIMBS * trig.LIMB
    i = p // trig.LIMB
    b = p - i * trig.LIMB
    return (((LIMBS[i] << trig.LIMB) | LIMBS[i + 1]) >> (trig.LIMB - b)) & MASK


@numba.njit(**_jit)
def payne_hanek(a):
    """``(n, r)`` of ``|x| = a > CW_MAX`` (finite): the quadrant (0..3) and the reduced
    argument, by the definition's integer reduction."""
    b = bits_of(a)
    e = (b >> trig.F64_MANT_BITS) - (trig.F64_EXP_BIAS + trig.F64_MANT_BITS)
    m = (b & trig.F64_MANT_MASK) | (1 << trig.F64_MANT_BITS)
    ms = (m & MASK, (m >> trig.LIMB) & MASK, m >> (2 * trig.LIMB))
    start = e - (trig.WINDOW_LEAD + 1)
    c = np.empty(trig.G_LIMBS, dtype=np.int64)
    for j in range(trig.G_LIMBS):
        c[j] = _window_limb(start + trig.LIMB * j)
    acc = np.zeros(trig.G_LIMBS, dtype=np.int64)
    for q in range(trig.G_LIMBS):
        for k in range(trig.M_LIMBS):
            if q + k < trig.G_LIMBS:
                acc[q] += ms[k] * c[q + k]
    for q in range(trig.G_LIMBS - 1, 0, -1):
        acc[q - 1] += acc[q] >> trig.LIMB
        acc[q] &= MASK
    n = acc[0] & 3
    neg = acc[1] >= TOP
    if neg:
        n += 1
        carry = 1
        for q in range(trig.G_LIMBS - 1, 0, -1):
            v = MASK - acc[q] + carry
            carry = v >> trig.LIMB
            acc[q] = v & MASK
    g1 = np.float64((acc[1] << trig.LIMB) | acc[2])
    g2 = np.float64((acc[3] << trig.LIMB) | acc[4])
    g3 = np.float64((acc[5] << trig.LIMB) | acc[6])
    g4 = np.float64(acc[7])
    s = ((g1 * 2.0**-48 + g2 * 2.0**-96) + g3 * 2.0**-144) + g4 * 2.0**-168
    r = s * trig.PIO2
    return n, (-r if neg else r)


@numba.njit(inline="always", **_jit)
def cody_waite(x):
    """``(n, r)`` of ``|x| <= CW_MAX``: x = n pi/2 + r (n in 0..3)."""
    t = x * trig.INV_PIO2 + trig.SHIFT
    k = t - trig.SHIFT
    n = (bits_of(t) - trig.SHIFT_BITS) & 3
    return n, (((x - k * trig.P1) - k * trig.P2) - k * trig.P3) - k * trig.P3T


@numba.njit(**_jit)
def reduce_far(x):
    """``(n, r)`` of a finite ``|x| > CW_MAX``, Payne-Hanek with x's sign."""
    n, r = payne_hanek(abs(x))
    if x < 0:
        return (-n) & 3, -r
    return n & 3, r


@numba.njit(inline="always", **_jit)
def sin_poly(r, w):
    S = SC[trig.POLY_DEGREE]
    for j in range(trig.POLY_DEGREE - 1, 0, -1):
        S = S * w + SC[j]
    return r + (r * w) * S


@numba.njit(inline="always", **_jit)
def cos_poly(w):
    C = CC[trig.POLY_DEGREE]
    for j in range(trig.POLY_DEGREE - 1, 1, -1):
        C = C * w + CC[j]
    return 1.0 - (0.5 * w - (w * w) * C)


@numba.njit(inline="always", **_jit)
def _from_reduced(x, n, r, want_sin):
    """sin(x) or cos(x) from its reduction (n, r), by selects."""
    w = r * r
    s = sin_poly(r, w)
    c = cos_poly(w)
    n = n if want_sin else (n + 1) & 3  # cos(x) = sin(x + pi/2)
    y = s if n == 0 else (c if n == 1 else (-s if n == 2 else -c))
    y = x if (want_sin and x == 0.0) else y
    return np.nan if x - x != 0.0 else y  # inf, NaN


@numba.njit(inline="always", **_jit)
def sincos_near(x, want_sin):
    """sin(x) or cos(x) for |x| <= CW_MAX (and inf, NaN)."""
    n, r = cody_waite(x)
    return _from_reduced(x, n, r, want_sin)


@numba.njit(**_jit)
def sincos(x, want_sin):
    """sin(x) (``want_sin``) or cos(x) of a float64, the definition's bits."""
    if abs(x) <= trig.CW_MAX or x - x != 0.0:
        return sincos_near(x, want_sin)
    n, r = reduce_far(x)
    return _from_reduced(x, n, r, want_sin)


@numba.njit(**_jit)
def _sincos_into(x, out, want_sin):
    """out[i] = sin / cos of x[i]: every element by Cody-Waite (a loop that vectorises),
    then the finite ones beyond CW_MAX again by Payne-Hanek."""
    for i in range(x.size):
        out[i] = sincos_near(np.float64(x[i]), want_sin)
    for i in range(x.size):
        v = np.float64(x[i])
        if abs(v) > trig.CW_MAX and v - v == 0.0:
            n, r = reduce_far(v)
            out[i] = _from_reduced(v, n, r, want_sin)


@numba.njit(**_jit)
def sin_into(x, out):
    """out[i] = sin(x[i]): x float32 or float64 (exact in float64), out float32 or
    float64 (rounded once)."""
    _sincos_into(x, out, True)


@numba.njit(**_jit)
def cos_into(x, out):
    """out[i] = cos(x[i]) (as :func:`sin_into`)."""
    _sincos_into(x, out, False)
