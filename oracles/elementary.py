"""detsample's defined elementary functions (detsample/arith/elementary.py's text) in numpy
float64, written on their own -- no torch, nothing imported from the package -- and
reproducing the package's bits exactly: exp, expm1, tanh, sigmoid, silu, softplus, gelu
(both forms), sqrt, rsqrt, pow by a scalar. Each numpy operation rounds each element once
(IEEE), so these are the roundings of the numba kernels and the torch composition.

Every function maps float64 values to float64; :func:`to32` rounds a result once to
float32, with the one NaN.
"""

from __future__ import annotations

import math

import numpy as np

from oracles import arith as defined

EXP_LO, EXP_HI, EXPM1_LO, TANH_BIG = -746.0, 710.0, -45.0, 20.0
INV_LN2 = float.fromhex("0x1.71547652b82fep+0")
LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
SHIFT = 1.5 * 2.0**52
C = [1.0 / math.factorial(j) for j in range(13)]  # exp: 1/j!
D = [1.0 / math.factorial(j + 2) for j in range(13)]  # expm1: 1/(j+2)!
SQRT_2_OVER_PI = float.fromhex("0x1.9884533d43651p-1")
INV_SQRT_2PI = float.fromhex("0x1.9884533d43651p-2")
KAPPA = 0.044715
SERIES_MAX, CF_TERMS = 2.0, 40
SERIES = [1.0 / math.prod(range(1, 2 * n + 2, 2)) for n in range(25)]  # 1 / (2n+1)!!
#: Mills' ratio's Taylor coefficients about 3 (M^(n)(3) / n!, rounded)
MILLS = [
    float.fromhex(h)
    for h in [
        "0x1.37e684ee8e185p-2",
        "-0x1.6131c4d156dc3p-4",
        "0x1.78098a8c67997p-6",
        "-0x1.7b8def8030db5p-8",
        "0x1.6d7c5bb10bd3cp-10",
        "-0x1.516888be198e5p-12",
        "0x1.2bcfe30697181p-14",
        "-0x1.01416a398089ep-16",
        "0x1.ab7b4d6ddac29p-19",
        "-0x1.58b5f601171fap-21",
        "0x1.0e5154ae7577cp-23",
        "-0x1.9d02cd122bb3dp-26",
        "0x1.33d614bf0d8b9p-28",
        "-0x1.c05448a4a1567p-31",
        "0x1.3f57f12794abcp-33",
        "-0x1.bd7c6e75371d2p-36",
        "0x1.30928f774001ap-38",
        "-0x1.9893c9253a8efp-41",
        "0x1.0d13ce496731cp-43",
        "-0x1.5c3e33404c104p-46",
        "0x1.bb27f03755589p-49",
        "-0x1.156c87e0d56c4p-51",
        "0x1.55f23d89c1dc4p-54",
        "-0x1.9f26187db41adp-57",
        "0x1.f0b53646fb85dp-60",
    ]
]  # noqa: E501 - one table


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def to32(y: np.ndarray) -> np.ndarray:
    """float64 -> float32, rounded once, NaN as 0x7fc00000."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.asarray(y, dtype=np.float64).astype(np.float32)
    return np.where(np.isnan(y), np.array([0x7FC00000], np.uint32).view(np.float32)[0], y)


def _nan(y: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(y), np.nan, y)


def _estrin(c: list[float], p: np.ndarray) -> np.ndarray:
    """Estrin's scheme: pairs c[2j] + c[2j+1] p, p squared, until one term is left."""
    while len(c) > 1:
        c = [c[2 * j] + c[2 * j + 1] * p for j in range(len(c) // 2)] + c[len(c) - len(c) % 2 :]
        p = p * p
    return c[0]


def _split(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k as integers, r): v = k ln2 + r, k = rint(v / ln 2)."""
    t = v * INV_LN2 + SHIFT
    k = t - SHIFT
    return k.astype(np.int64), (v - k * LN2_HI) - k * LN2_LO


def exp(x) -> np.ndarray:
    x = _f64(x)
    k, r = _split(np.clip(np.nan_to_num(x, nan=0.0), EXP_LO, EXP_HI))
    k1 = k // 2
    with np.errstate(over="ignore"):
        y = (_estrin(C, r) * np.ldexp(1.0, k1)) * np.ldexp(1.0, k - k1)
    return np.where(np.isnan(x), np.nan, y)


def expm1(x) -> np.ndarray:
    x = _f64(x)
    k, r = _split(np.clip(np.nan_to_num(x, nan=0.0), EXPM1_LO, EXP_HI))
    q = r + (r * r) * _estrin(D, r)
    h = np.ldexp(1.0, k - 1)
    with np.errstate(over="ignore"):
        y = 2.0 * (q * h + (h - 0.5))
    y = np.where(k == 0, q, y)
    y = np.where(x == 0, x, y)
    return np.where(np.isnan(x), np.nan, y)


def tanh(x) -> np.ndarray:
    x = _f64(x)
    t = expm1(2.0 * np.minimum(np.abs(x), TANH_BIG))
    with np.errstate(invalid="ignore"):
        return _nan(np.copysign(t / (t + 2.0), x))


def sigmoid(x) -> np.ndarray:
    return _nan(1.0 / (1.0 + exp(-_f64(x))))


def silu(x) -> np.ndarray:
    x = _f64(x)
    with np.errstate(invalid="ignore"):
        return _nan(x / (1.0 + exp(-x)))


def _log64(v: np.ndarray) -> np.ndarray:
    return np.array([defined.log64(float(a)) for a in v.ravel()]).reshape(v.shape)


def softplus(x, beta: float = 1.0, threshold: float = 20.0) -> np.ndarray:
    x = _f64(x)
    z = x * beta
    u = exp(z)
    w = 1.0 + u
    with np.errstate(invalid="ignore", divide="ignore"):
        lp = np.where((w == 1.0) | (u == np.inf), u, _log64(w) * (u / (w - 1.0)))
        return _nan(np.where(z > threshold, x, lp / beta))


def gelu_tanh(x) -> np.ndarray:
    x = _f64(x)
    with np.errstate(over="ignore", invalid="ignore"):
        y = SQRT_2_OVER_PI * (x + KAPPA * ((x * x) * x))
        return _nan(x / (1.0 + exp(-2.0 * y)))


def _phi(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return exp(-(v * v) * 0.5) * INV_SQRT_2PI


def gelu_erf(x) -> np.ndarray:
    """x Phi(x): series for |x| <= 2, Mills' ratio's Taylor series about 3 up to 4,
    Laplace's continued fraction beyond."""
    x = _f64(x)
    a = np.abs(x)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        central = 0.5 + _phi(x) * (x * _estrin(SERIES, x * x))
        mills = _phi(a) * _estrin(MILLS, a - 3.0)
        t = a.copy()
        for k in range(CF_TERMS, 0, -1):
            t = a + float(k) / t
        q = np.where(a <= 4.0, mills, _phi(a) / t)
        tail = np.where(x < 0, q, 1.0 - q)
        return _nan(x * np.where(a <= SERIES_MAX, central, tail))


def sqrt(x) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return _nan(np.sqrt(_f64(x)))


def rsqrt(x) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return _nan(1.0 / np.sqrt(_f64(x)))


def pow_scalar(x, e: float) -> np.ndarray:
    """x ** e for a scalar e, by the definition's cases."""
    x, e = _f64(x), float(e)
    if e == 0.5:
        return sqrt(x)
    if e == -0.5:
        return rsqrt(x)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        if e.is_integer() and abs(e) < 2**31:
            n, y, b = int(abs(e)), np.ones_like(x), x.copy()
            while n:
                if n % 2:
                    y = y * b
                n //= 2
                if n:
                    b = b * b
            return _nan(1.0 / y if e < 0 else y)
        if e != e:
            return np.full_like(x, np.nan)
        m = np.abs(x)
        ok = (m > 0) & (m < np.inf)
        a = exp(e * _log64(np.where(ok, m, 1.0)))
        a = np.where(ok, a, np.where(m == 0, 0.0 if e > 0 else np.inf, np.inf if e > 0 else 0.0))
        odd = math.isfinite(e) and e.is_integer() and abs(e) < 2**53 and int(e) % 2 == 1
        neg = -a if odd else (a if (e.is_integer() or math.isinf(e)) else np.where(m == np.inf, a, np.nan))
        return _nan(np.where(np.isnan(x), np.nan, np.where(x < 0, neg, a)))
