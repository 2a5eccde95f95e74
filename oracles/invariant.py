"""The portable batch-invariant arithmetic, per element in numpy: the specification of
``detsample.invariant.fixedpoint`` (the portable product) and ``detsample.invariant.tree``
(the portable row sum). Never imports torch.

Products are exact Python integers here (no BLAS, no float64 sums), so a bit-for-bit match
shows that the torch implementation, whatever BLAS kernel, chunking or thread count it
ran with, computed the exact integer sum the definition asks for.
"""

from __future__ import annotations

import math

import numpy as np

A_BITS = 21
B_BITS = 24


def _exponent(x: float) -> int:
    """``e`` with ``x = f * 2**e``, ``f`` in [0.5, 1) (0 for 0): C's ``frexp``."""
    return math.frexp(x)[1]


def _fixed(values: np.ndarray, bits: int) -> tuple[list[int], int]:
    """Integers ``round_half_even(v * 2**(bits - e))`` of one row / column, and ``e``."""
    e = _exponent(float(np.max(np.abs(values)))) if values.size else 0
    scale = 2.0 ** (bits - e)
    return [int(np.round(float(v) * scale)) for v in values], e


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The portable product of float32 ``a (M, K)`` and ``b (K, N)``, element by element.

    Row scale ``e_m`` and integers ``a_int`` per row of ``a`` (A_BITS), column scale ``f_n``
    and ``b_int`` per column of ``b`` (B_BITS); ``S = sum_k a_int * b_int`` exactly;
    ``C = float32(float64(S) * 2**(e_m - A_BITS) * 2**(f_n - B_BITS))``. A row or column with
    a non-finite value gives NaN where it meets."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    m, k = a.shape
    n = b.shape[1]
    out = np.empty((m, n), dtype=np.float32)
    cols = []
    for j in range(n):
        col = b[:, j]
        cols.append((bool(np.all(np.isfinite(col))), _fixed(np.where(np.isfinite(col), col, 0), B_BITS)))
    for i in range(m):
        row = a[i]
        row_ok = bool(np.all(np.isfinite(row)))
        ints, e = _fixed(np.where(np.isfinite(row), row, 0), A_BITS)
        for j in range(n):
            col_ok, (bints, f) = cols[j]
            if not (row_ok and col_ok):
                out[i, j] = np.nan
                continue
            s = sum(x * y for x, y in zip(ints, bints))
            # the two power-of-two factors are applied one after the other, as in torch
            out[i, j] = np.float32(float(s) * 2.0 ** (e - A_BITS) * 2.0 ** (f - B_BITS))
    return out


def weighted_sum(p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The portable ``p @ v`` with ``v`` scaled per row (key): ``g_k`` the exponent of
    ``max_n |v[k, n]|``, ``v_int = round(v * 2**(B_BITS - g_k))``; ``p' = p * 2**g_k``
    (exact), ``p_int`` per row of ``p'`` (A_BITS, exponent ``e_m``);
    ``C = float32(float64(sum_k p_int v_int) * 2**(e_m - A_BITS) * 2**-B_BITS)``."""
    p = np.asarray(p, dtype=np.float32)
    v = np.asarray(v, dtype=np.float32)
    m, k = p.shape
    n = v.shape[1]
    keys = [_fixed(v[r], B_BITS) for r in range(k)]
    out = np.empty((m, n), dtype=np.float32)
    for i in range(m):
        scaled = np.array([float(p[i, r]) * 2.0 ** keys[r][1] for r in range(k)])
        ints, e = _fixed(scaled, A_BITS)
        for j in range(n):
            s = sum(ints[r] * keys[r][0][j] for r in range(k))
            out[i, j] = np.float32(float(s) * 2.0 ** (e - A_BITS) * 2.0 ** (-B_BITS))
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
