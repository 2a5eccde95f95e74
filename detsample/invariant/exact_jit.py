"""The numba kernels of :mod:`detsample.invariant.exact` (this module imports numba;
exact.py imports it on first use and runs its torch stages where numba is missing).

Each kernel decides what the portable product's definition decides -- ``RN32`` of an
exact sum -- and nothing else: stage 1 and stage 2 settle an element only where an error
bound proves the rounding, stage 3 computes it exactly. So the kernels give the bits of
the torch stages, element for element, while they cost one pass where the torch stages
take a dozen operator calls (the decode step's budget: a product of 8 rows settled ~1
element in ~0.45 ms of ~2 ms). Compiled without fast-math (no contraction into fused
multiply-adds, no reassociation: TwoSum is only error free as written; tests/invariant/
test_exact.py checks the assembly). Every result is a function of its own element or
row, so a split over threads changes no bit.
"""

from __future__ import annotations

import math

import numba
import numpy as np

_jit = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)


@numba.njit(**_jit)
def first_pass_rows(d, mag, pre, g, lo, flags, start, stop):
    """Stage 1 for rows ``[start, stop)``: d, mag (R, N) float64 (the float64 GEMM and its
    magnitude bound), ``e = (mag * pre) * g`` the error bound (as :func:`exact.first_pass`
    scales it), lo (R, N) float32 <- ``RN32(d + 0.0 - e)``, flags (R, N) bool <- whether
    ``RN32(d - e)`` and ``RN32(d + e)`` differ (bits: -0.0 and +0.0 differ). Returns how
    many differ."""
    left = 0
    for r in range(start, stop):
        for j in range(d.shape[1]):
            e = (mag[r, j] * pre) * g
            x = d[r, j] + 0.0
            low = np.float32(x - e)
            high = np.float32(x + e)
            lo[r, j] = low
            differ = not (low == high and math.copysign(1.0, low) == math.copysign(1.0, high))
            flags[r, j] = differ
            left += differ
    return left


@numba.njit(**_jit)
def _fsum(p, n, extra, parts):
    """math.fsum of ``p[:n]`` followed by ``extra`` (CPython's algorithm: Shewchuk's
    non-overlapping partials, then the correctly rounded float64 of their exact sum, ties
    to even). ``parts`` a scratch float64 array of at least ``n + 2`` elements. The terms
    are finite and their partial sums cannot overflow (exact products of float32 values)."""
    used = 0
    for idx in range(n + 1):
        x = p[idx] if idx < n else extra
        i = 0
        for q in range(used):
            y = parts[q]
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            low = y - (hi - x)
            if low != 0.0:
                parts[i] = low
                i += 1
            x = hi
        used = i
        if x != 0.0:
            parts[used] = x
            used += 1
    if used == 0:
        return 0.0
    n_ = used - 1
    hi = parts[n_]
    low = 0.0
    while n_ > 0:
        x = hi
        n_ -= 1
        y = parts[n_]
        hi = x + y
        yr = hi - x
        low = y - yr
        if low != 0.0:
            break
    if n_ > 0 and ((low < 0.0 and parts[n_ - 1] < 0.0) or (low > 0.0 and parts[n_ - 1] > 0.0)):
        y = low * 2.0
        x = hi + y
        yr = x - hi
        if y == yr:
            hi = x
    return hi


@numba.njit(**_jit)
def _exact_f32(p, parts):
    """Stage 3 for one row of exact terms ``p`` (float64): ``RN32(sum(p))`` exactly, as
    :func:`exact.exact_f32` decides it (``+0.0`` for an exact zero)."""
    n = p.shape[0]
    s = _fsum(p, n, 0.0, parts)  # RN64 of the exact sum
    c = np.float32(s)
    if np.float64(c) == s:
        return c + np.float32(0.0)
    other = np.nextafter(c, np.float32(math.copysign(math.inf, s - np.float64(c))))
    if s != (np.float64(c) + np.float64(other)) / 2.0:  # not a float32 midpoint
        return c
    r = _fsum(p, n, -s, parts)  # the exact residual's sign
    if r == 0.0:
        return c  # an exact tie: rounded to even by the conversion
    return max(c, other) if r > 0.0 else min(c, other)


@numba.njit(**_jit)
def _settle(p, g, two_ulp, parts):
    """Stages 2 and 3 for one row of exact products ``p`` (K,) float64: ``RN32`` of its
    exact sum. Stage 2: the products added in order by TwoSum (error free), the errors
    summed in float64, ``S`` within ``g * sum|errors| + two_ulp * |d|`` of ``d = s + t``
    (the bound of :func:`exact._second_pass`); where both ends round to the same float32
    (bits), that is the result; else stage 3 (:func:`_exact_f32`)."""
    s = 0.0
    t = 0.0
    ta = 0.0
    for q in range(p.shape[0]):
        y = p[q]
        x = s + y
        yv = x - s
        e = (s - (x - yv)) + (y - yv)
        s = x
        t += e
        ta += abs(e)
    d = (s + t) + 0.0
    bound = ta * g + abs(d) * two_ulp
    low = np.float32(d - bound)
    high = np.float32(d + bound)
    if low == high and math.copysign(1.0, low) == math.copysign(1.0, high):
        return low
    return _exact_f32(p, parts)


@numba.njit(**_jit)
def settle_rows(p, g, two_ulp, out, start, stop):
    """:func:`_settle` for rows ``[start, stop)`` of exact products ``p`` (F, K) float64:
    out (F,) float32."""
    parts = np.empty(p.shape[1] + 2, np.float64)
    for f in range(start, stop):
        out[f] = _settle(p[f], g, two_ulp, parts)


@numba.njit(**_jit)
def settle_pairs(a, b, index, g, two_ulp, out, start, stop):
    """:func:`_settle` for the elements ``index[start:stop]`` (int64, flat indices of a
    ``(nb, M, N)`` result) of ``a (nb, M, K) @ b (nb, K, N)`` (float64, exact values of
    float32 operands; any strides): out (M * N * nb,) float32, flat, written at those
    indices. The products are exact in float64."""
    m, k, n = a.shape[1], a.shape[2], b.shape[2]
    p = np.empty(k, np.float64)
    parts = np.empty(k + 2, np.float64)
    for f in range(start, stop):
        flat = index[f]
        col = flat % n
        row = (flat // n) % m
        mat = flat // (n * m)
        for q in range(k):
            p[q] = a[mat, row, q] * b[mat, q, col]
        out[flat] = _settle(p, g, two_ulp, parts)


@numba.njit(**_jit)
def prepare_rows(x, block, pre, post, values, blocks, bad, start, stop):
    """:func:`exact.prepare` of rows ``[start, stop)`` (row ``r``: matrix ``r // M``, row
    ``r % M``) of ``x (nb, M, K)`` float32 (any strides) along K: values (nb, M, K)
    float64 <- ``x`` (exact; non-finite entries 0), blocks (nb, M, nblk) float64 <- an
    upper bound of the Euclidean norm of each ``block``-long K-block (``sqrt(sum * pre) *
    post``, the factors of exact.prepare), bad (nb, M) bool <- whether the row holds a
    non-finite value. Returns how many rows do."""
    m, k = x.shape[1], x.shape[2]
    nbad = 0
    for r in range(start, stop):
        mat, row = r // m, r % m
        row_bad = False
        for b0 in range(0, k, block):
            sq = 0.0
            for q in range(b0, min(b0 + block, k)):
                v = np.float64(x[mat, row, q])
                if not math.isfinite(v):
                    row_bad = True
                    v = 0.0
                values[mat, row, q] = v
                sq += v * v
            blocks[mat, row, b0 // block] = math.sqrt(sq * pre) * post
        bad[mat, row] = row_bad
        nbad += row_bad
    return nbad


@numba.njit(**_jit)
def prepare_cols(x, block, pre, post, values, blocks, col_bad, row_bad, start, stop):
    """:func:`exact.prepare` of matrices ``[start, stop)`` of ``x (nb, K, N)`` float32
    along K (the B operand: per column): values (nb, K, N) float64 <- ``x`` (exact;
    non-finite entries 0), blocks (nb, nblk, N) float64 <- the block norm bounds of
    :func:`prepare_rows` per column, col_bad (nb, N) / row_bad (nb, K) bool <- whether
    the column / the row (the attention's key) holds a non-finite value. Returns how many
    columns do."""
    k, n = x.shape[1], x.shape[2]
    sq = np.empty(n, np.float64)
    nbad = 0
    for mat in range(start, stop):
        for j in range(n):
            col_bad[mat, j] = False
        for b0 in range(0, k, block):
            for j in range(n):
                sq[j] = 0.0
            for q in range(b0, min(b0 + block, k)):
                bad = False
                for j in range(n):
                    v = np.float64(x[mat, q, j])
                    if not math.isfinite(v):
                        bad = True
                        col_bad[mat, j] = True
                        v = 0.0
                    values[mat, q, j] = v
                    sq[j] += v * v
                row_bad[mat, q] = bad
            for j in range(n):
                blocks[mat, b0 // block, j] = math.sqrt(sq[j] * pre) * post
        for j in range(n):
            nbad += col_bad[mat, j]
    return nbad
