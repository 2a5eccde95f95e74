"""The portable batch-invariant arithmetic, per element in numpy: the specification of
``detsample.invariant.exact`` (the portable product) and ``detsample.invariant.tree``
(the portable row sum). Never imports torch.

Products are exact rationals here (``fractions.Fraction``: no BLAS, no float64 sums, no
error bounds), rounded to float32 by integer arithmetic, so a bit-for-bit match shows that
the torch implementation, whatever BLAS kernel, chunking or thread count it ran with,
returned the float32 nearest to the exact product.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np


def round_f32(q: Fraction) -> np.float32:
    """The float32 nearest to ``q`` (ties to even; past the largest float32 by half an
    ulp or more: infinity; an exact zero: +0.0; a non-zero value that rounds to zero
    keeps its sign)."""
    if q == 0:
        return np.float32(0.0)
    sign = -1.0 if q < 0 else 1.0
    x = abs(q)
    e = x.numerator.bit_length() - x.denominator.bit_length()  # 2**e <= x < 2**(e+2)
    while Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    quantum = Fraction(2) ** (max(e, -126) - 23)  # float32 spacing at x
    n, rest = divmod(x, quantum)
    n = int(n)
    if rest * 2 > quantum or (rest * 2 == quantum and n % 2 == 1):
        n += 1
    value = n * quantum
    if value >= Fraction(2) ** 128:
        return np.float32(sign * math.inf)
    return np.float32(sign * float(value))


def _dot(row: np.ndarray, col: np.ndarray) -> np.float32:
    return round_f32(sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(row, col)), Fraction(0)))


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The portable product of float32 ``a (M, K)`` and ``b (K, N)``, element by element:
    ``C[m, n] = RN32(sum_k a[m, k] * b[k, n])`` with the sum exact and one rounding to
    float32. A row or column with a non-finite value gives NaN where it meets."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    out = np.empty((a.shape[0], b.shape[1]), dtype=np.float32)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            finite = bool(np.all(np.isfinite(a[i])) and np.all(np.isfinite(b[:, j])))
            out[i, j] = _dot(a[i], b[:, j]) if finite else np.nan
    return out


def weighted_sum(p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The portable ``p @ v`` (weights over keys): the same ``RN32`` of the exact sum;
    NaN in a row with a non-finite weight, or with a non-zero weight on a key (row of
    ``v``) holding a non-finite value; a zero weight ignores its key."""
    p = np.asarray(p, dtype=np.float32)
    v = np.asarray(v, dtype=np.float32)
    out = np.empty((p.shape[0], v.shape[1]), dtype=np.float32)
    for i in range(p.shape[0]):
        used = [r for r in range(p.shape[1]) if p[i, r] != 0]
        poisoned = (not np.all(np.isfinite(p[i]))) or any(not np.all(np.isfinite(v[r])) for r in used)
        for j in range(v.shape[1]):
            out[i, j] = np.nan if poisoned else _dot(p[i, used], v[used, j])
    return out


def tree_sum(row: np.ndarray) -> np.float32 | np.float64:
    """The portable row sum: with ``h`` the largest power of two below the length,
    ``x[i] += x[i + h]`` where ``i + h`` exists, keep the first ``h``, repeat."""
    x = [row.dtype.type(v) for v in row]
    if not x:
        return row.dtype.type(0)
    while len(x) > 1:
        h = 1 << ((len(x) - 1).bit_length() - 1)
        x = [x[i] + x[i + h] if i + h < len(x) else x[i] for i in range(h)]
    return x[0]
