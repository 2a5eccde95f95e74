"""The numba kernels of :mod:`detsample.arith.elementary`: each function the definition
spelled as scalar code on one float64, compiled without fast-math (LLVM keeps every
operation as written: no contraction into FMAs, no reassociation), and one loop per
function over a 1-D array. A loop takes float32 or float64 input and writes float32 or
float64 output: the float64 value rounds once on the store. Imported on first use by
:mod:`detsample.arith.pointwise`.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from detsample.arith import elementary as E
from detsample.arith import spec
from detsample.arith.jit import bits_of, from_bits, log64

_jit = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)
C = spec.EXP_COEFS
D = E.EXPM1_COEFS
PS = E.PHI_SERIES
MC = E.MILLS_COEFS
BIAS_SHIFT = spec.SHIFT_BITS - spec.F64_EXP_BIAS


@numba.njit(inline="always", **_jit)
def _estrin(r, c):
    """spec's Estrin polynomial of degree 12 with coefficients ``c``."""
    r2 = r * r
    r4 = r2 * r2
    r8 = r4 * r4
    a0 = c[0] + c[1] * r
    a1 = c[2] + c[3] * r
    a2 = c[4] + c[5] * r
    a3 = c[6] + c[7] * r
    a4 = c[8] + c[9] * r
    a5 = c[10] + c[11] * r
    b0 = a0 + a1 * r2
    b1 = a2 + a3 * r2
    b2 = a4 + a5 * r2
    d0 = b0 + b1 * r4
    d1 = b2 + c[12] * r4
    return d0 + d1 * r8


@numba.njit(inline="always", **_jit)
def _pow2(k):
    """2**k for an int64 ``k`` in the float64 normal range."""
    return from_bits((k + spec.F64_EXP_BIAS) << spec.F64_MANT_BITS)


@numba.njit(inline="always", **_jit)
def _reduce(v):
    """(t, k, r) of the definition: t's bits hold k = rint(v / ln 2)."""
    t = v * spec.INV_LN2 + spec.SHIFT
    k = t - spec.SHIFT
    r = (v - k * spec.LN2_HI) - k * spec.LN2_LO
    return t, k, r


@numba.njit(inline="always", **_jit)
def exp(x):
    """e**x of a float64, float64."""
    v = min(max(x, E.EXP_LO), E.EXP_HI)  # selects (see jit.exp64); NaN: the last line
    t, _, r = _reduce(v)
    p = _estrin(r, C)
    k = bits_of(t) - spec.SHIFT_BITS
    k1 = k >> 1
    y = (p * _pow2(k1)) * _pow2(k - k1)
    return np.nan if x != x else y


@numba.njit(inline="always", **_jit)
def expm1(x):
    """e**x - 1 of a float64, float64."""
    v = min(max(x, E.EXPM1_LO), E.EXP_HI)
    t, _, r = _reduce(v)
    q = r + (r * r) * _estrin(r, D)
    k = bits_of(t) - spec.SHIFT_BITS
    h = _pow2(k - 1)
    y = 2.0 * ((q * h) + (h - 0.5))
    y = q if k == 0 else y
    y = x if x == 0.0 else y
    return np.nan if x != x else y


@numba.njit(inline="always", **_jit)
def tanh(x):
    """tanh of a float64, float64."""
    s = abs(x)
    s = min(s, E.TANH_BIG)
    t = expm1(2.0 * s)
    y = math.copysign(t / (t + 2.0), x)
    return np.nan if x != x else y


@numba.njit(inline="always", **_jit)
def sigmoid(x):
    y = 1.0 / (1.0 + exp(-x))
    return np.nan if y != y else y


@numba.njit(inline="always", **_jit)
def silu(x):
    y = x / (1.0 + exp(-x))
    return np.nan if y != y else y


@numba.njit(inline="always", **_jit)
def softplus(x, beta, threshold):
    z = x * beta
    u = exp(z)
    w = 1.0 + u
    lp = u if (w == 1.0) | (u == np.inf) else log64(w) * (u / (w - 1.0))
    y = x if z > threshold else lp / beta
    return np.nan if y != y else y


@numba.njit(inline="always", **_jit)
def gelu_tanh(x):
    y = E.SQRT_2_OVER_PI * (x + E.GELU_KAPPA * ((x * x) * x))
    g = x / (1.0 + exp(-2.0 * y))
    return np.nan if g != g else g


@numba.njit(inline="always", **_jit)
def _phi(v):
    return exp(-(v * v) * 0.5) * E.INV_SQRT_2PI


@numba.njit(inline="always", **_jit)
def _estrin25(c, p):
    """The definition's ``estrin`` of 25 coefficients ``c`` at ``p``."""
    p2 = p * p
    p4 = p2 * p2
    p8 = p4 * p4
    p16 = p8 * p8
    b0 = (c[0] + c[1] * p) + (c[2] + c[3] * p) * p2
    b1 = (c[4] + c[5] * p) + (c[6] + c[7] * p) * p2
    b2 = (c[8] + c[9] * p) + (c[10] + c[11] * p) * p2
    b3 = (c[12] + c[13] * p) + (c[14] + c[15] * p) * p2
    b4 = (c[16] + c[17] * p) + (c[18] + c[19] * p) * p2
    b5 = (c[20] + c[21] * p) + (c[22] + c[23] * p) * p2
    f0 = (b0 + b1 * p4) + (b2 + b3 * p4) * p8
    f1 = (b4 + b5 * p4) + c[24] * p8
    return f0 + f1 * p16


@numba.njit(inline="always", **_jit)
def _gelu_erf_near(x):
    """x Phi(x) for |x| <= MILLS_MAX (the series or Mills' ratio, by a select: the loop
    over it vectorises)."""
    a = abs(x)
    ph = _phi(a)  # phi(x): x * x == a * a
    central = 0.5 + ph * (x * _estrin25(PS, x * x))
    Q = ph * _estrin25(MC, a - E.MILLS_CENTER)
    tail = Q if x < 0.0 else 1.0 - Q
    g = x * (central if a <= E.PHI_SERIES_MAX else tail)
    return np.nan if g != g else g


@numba.njit(**_jit)
def gelu_erf_far(x):
    """x Phi(x) for |x| > MILLS_MAX: the continued fraction."""
    a = abs(x)
    t = a
    for k in range(E.PHI_CF_TERMS, 0, -1):
        t = a + k / t
    Q = _phi(a) / t
    g = x * (Q if x < 0.0 else 1.0 - Q)
    return np.nan if g != g else g


@numba.njit(inline="always", **_jit)
def rsqrt(x):
    y = 1.0 / math.sqrt(x) if x >= 0.0 else np.nan
    return np.nan if y != y else y


@numba.njit(**_jit)
def pow_int(x, n):
    """x**n by square-and-multiply, n an integer with |n| < POW_INT_MAX."""
    m = abs(n)
    y = 1.0
    b = x
    while m:
        if m & 1:
            y = y * b
        m >>= 1
        if m:
            b = b * b
    y = 1.0 / y if n < 0 else y
    return np.nan if y != y else y


@numba.njit(**_jit)
def pow_general(x, e, odd):
    """x**e for an exponent that is neither +-0.5 nor a small integer (``odd``: e is an
    odd integer)."""
    if (x != x) | (e != e):
        return np.nan
    m = abs(x)
    if m == 0.0:
        a = 0.0 if e > 0.0 else np.inf
    elif m == np.inf:
        a = np.inf if e > 0.0 else 0.0
    else:
        a = exp(e * log64(m))
    if x < 0.0:
        if odd:
            return -a
        return a if (e == np.floor(e)) | (m == np.inf) else np.nan
    return a


# -- loops: out[i] = f(float64(x[i])), rounded to out's dtype on the store ---------------


@numba.njit(**_jit)
def exp_into(x, out):
    for i in range(x.size):
        out[i] = exp(np.float64(x[i]))


@numba.njit(**_jit)
def expm1_into(x, out):
    for i in range(x.size):
        out[i] = expm1(np.float64(x[i]))


@numba.njit(**_jit)
def log_into(x, out):
    for i in range(x.size):
        v = log64(np.float64(x[i]))
        out[i] = np.nan if v != v else v


@numba.njit(**_jit)
def tanh_into(x, out):
    for i in range(x.size):
        out[i] = tanh(np.float64(x[i]))


@numba.njit(**_jit)
def sigmoid_into(x, out):
    for i in range(x.size):
        out[i] = sigmoid(np.float64(x[i]))


@numba.njit(**_jit)
def silu_into(x, out):
    for i in range(x.size):
        out[i] = silu(np.float64(x[i]))


@numba.njit(**_jit)
def softplus_into(x, out, beta, threshold):
    for i in range(x.size):
        out[i] = softplus(np.float64(x[i]), beta, threshold)


@numba.njit(**_jit)
def gelu_tanh_into(x, out):
    for i in range(x.size):
        out[i] = gelu_tanh(np.float64(x[i]))


@numba.njit(**_jit)
def gelu_erf_into(x, out):
    """Every element by the near form (vectorised), then the few beyond MILLS_MAX again."""
    for i in range(x.size):
        out[i] = _gelu_erf_near(np.float64(x[i]))
    for i in range(x.size):
        v = np.float64(x[i])
        if abs(v) > E.MILLS_MAX:
            out[i] = gelu_erf_far(v)


@numba.njit(**_jit)
def rsqrt_into(x, out):
    for i in range(x.size):
        out[i] = rsqrt(np.float64(x[i]))


@numba.njit(**_jit)
def sqrt_into(x, out):
    for i in range(x.size):
        v = np.float64(x[i])
        y = math.sqrt(v) if v >= 0.0 else np.nan
        out[i] = np.nan if y != y else y


@numba.njit(**_jit)
def pow_int_into(x, out, n):
    for i in range(x.size):
        out[i] = pow_int(np.float64(x[i]), n)


@numba.njit(**_jit)
def pow_general_into(x, out, e, odd):
    for i in range(x.size):
        out[i] = pow_general(np.float64(x[i]), e, odd)
