"""detsample's defined exp, log, exact sum and log_softmax in numpy float64: the
specification (docs/sampling.md "Defined arithmetic"), written on its own -- no torch,
nothing imported from the package -- and reproducing the package's bits exactly.

Every operation is one IEEE operation on float64 (or int64) arrays: numpy rounds each
element once, so these are the same roundings as the numba kernels and the torch
composition of detsample.arith.
"""

from __future__ import annotations

import math

import numpy as np

EXP_LO, EXP_HI = -104.0, 89.0
INV_LN2 = float.fromhex("0x1.71547652b82fep+0")
LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
SHIFT = 1.5 * 2.0**52
C = [1.0 / math.factorial(j) for j in range(13)]  # exp: Taylor, 1/j!
LOG_C = [1.0 / (2 * j + 1) for j in range(11)]  # log: atanh series, 1/(2j+1)
SQRT_HALF = float.fromhex("0x1.6a09e667f3bcdp-1")
NAN32 = np.array([0x7FC00000], dtype=np.uint32).view(np.float32)[0]


def frac_bits(n: int) -> int:
    """Fraction bits F of the fixed-point sums of n terms: n * 2**F <= 2**62, F <= 52."""
    return min(52, 62 - max(1, math.ceil(math.log2(max(n, 2)))))


def exp64(x: np.ndarray) -> np.ndarray:
    """exp of float64 values, rounded to float32."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        e = exp64_wide(x).astype(np.float32)
    return np.where(np.isnan(x), NAN32, e)


def exp64_wide(x: np.ndarray) -> np.ndarray:
    """The float64 value ``p * 2**k`` that exp64 rounds to float32 (NaN where x is)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        v = np.minimum(np.maximum(x, EXP_LO), EXP_HI)
    t = v * INV_LN2 + SHIFT  # rint(v / ln 2) in the low mantissa bits
    k = t - SHIFT
    r = (v - k * LN2_HI) - k * LN2_LO
    r2 = r * r
    r4 = r2 * r2
    r8 = r4 * r4
    a = [C[2 * j] + C[2 * j + 1] * r for j in range(6)]
    b0, b1, b2 = a[0] + a[1] * r2, a[2] + a[3] * r2, a[4] + a[5] * r2
    p = (b0 + b1 * r4) + (b2 + C[12] * r4) * r8
    two_k = np.ldexp(1.0, np.where(np.isnan(k), 0.0, k).astype(np.int64))  # exact: 2**k
    return p * two_k


def exp32(z: np.ndarray) -> np.ndarray:
    """exp of float32 values (float64(z) is exact)."""
    return exp64(np.asarray(z, dtype=np.float32).astype(np.float64))


def log64(x: float) -> float:
    """Natural log of one float64."""
    if math.isnan(x) or x < 0:
        return math.nan
    if x == 0:
        return -math.inf
    if x == math.inf:
        return math.inf
    m, e = math.frexp(x)  # x = m 2**e, m in [1/2, 1): exact
    if m < SQRT_HALF:
        m, e = m * 2.0, e - 1
    f = m - 1.0
    s = f / (f + 2.0)
    w = s * s
    R = LOG_C[10]
    for j in range(9, 0, -1):
        R = R * w + LOG_C[j]
    return e * LN2_HI + ((s + s * (w * R)) * 2.0 + e * LN2_LO)


def fixed_sum(e: np.ndarray, frac: int) -> float:
    """sum(e) of float32 values in [0, 1], exactly, in two words of ``frac`` bits each."""
    scale = 2.0**frac
    w = np.asarray(e, dtype=np.float32).astype(np.float64) * scale  # exact scaling
    h = np.trunc(w)
    H = int(h.astype(np.int64).sum())  # exact integer sums: any order
    L = int(np.trunc((w - h) * scale).astype(np.int64).sum())
    return (float(H) + float(L) * (1.0 / scale)) * (1.0 / scale)


def log_softmax(row: np.ndarray) -> np.ndarray:
    """log_softmax of one float32 row, float32."""
    x = np.asarray(row, dtype=np.float32)
    if np.isnan(x).any() or not np.isfinite(x).any() or np.isposinf(x).any():
        return np.full(x.shape, NAN32, dtype=np.float32)
    d = x.astype(np.float64) - np.float64(x.max())
    G = log64(fixed_sum(exp64(d), frac_bits(x.size)))
    return (d - G).astype(np.float32)
