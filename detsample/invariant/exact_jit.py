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

Two kinds of loop are the exceptions, each a sum whose bound holds in any order, so
that they vectorise: :func:`_row_squares`, the sums of squares of the block norms,
compiled with reassociation alone (``fastmath={"reassoc"}``) -- the norms are upper
bounds, never results: each square of a float32 is exact in float64 and
:func:`exact.inflation` covers a computed sum of non-negative terms in any order -- and
the decode kernel's dot products (:func:`_dots4`, :func:`_dots4x2`, :func:`_dot`),
compiled with reassociation and contraction (``fastmath={"reassoc", "contract"}``):
stage 1's bound already allows any order inside a 256-long chunk, and a product of two
float32 values is exact in float64, so a fused multiply-add rounds what the add would.
Either can move which elements reach stage 2, never a result's bits; every other kernel
(stage 1's arithmetic, TwoSum, fsum) is strict, and tests/invariant/test_exact.py checks
the flag sets. The contiguous kernels index with unsigned integers: numba's signed
indices carry a negative-index check that keeps LLVM from vectorising a loop (a 786k-value
operand: 1.4 ms -> 0.35 ms).
"""

from __future__ import annotations

import math

import numba
import numpy as np

_jit = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)
_U = numba.uint64  # an index that cannot be negative: no wraparound check, the loop vectorises


@numba.njit(**_jit, inline="always")
def _first(d, mag, pre, g):
    """Stage 1 for one element: ``(RN32(d + 0.0 - e), whether RN32(d - e) and RN32(d +
    e) differ)`` with ``e = (mag * pre) * g`` (as :func:`exact.first_pass` scales it;
    bits: -0.0 and +0.0 differ)."""
    e = (mag * pre) * g
    x = d + 0.0
    low = np.float32(x - e)
    high = np.float32(x + e)
    return low, (low != high) | (np.signbit(low) != np.signbit(high))


@numba.njit(**_jit)
def first_pass_flat(d, mag, pre, g, lo, flags, start, stop):
    """Stage 1 (:func:`_first`) for elements ``[start, stop)`` of flat contiguous arrays:
    d, mag (float64, the float64 GEMM and its magnitude bound) -> lo (float32), flags
    (bool). Branch free, unsigned indices: it vectorises. Returns how many differ."""
    left = 0
    for i in range(_U(start), _U(stop)):
        low, differ = _first(d[i], mag[i], pre, g)
        lo[i] = low
        flags[i] = differ
        left += differ
    return left


#: the dot products' loops: reassociated (any order is within the bound, see
#: :func:`decode_first_pass`) and contracted (a product of two float32 values is exact in
#: float64, so a fused multiply-add rounds exactly what the add would): they vectorise
_sums = dict(_jit, fastmath={"reassoc", "contract"})


@numba.njit(**_jit, inline="always")
def _rows4(at, k, last):
    """The offsets of four rows ``at + min(r, last) * k``, r = 0..3 (unsigned)."""
    return _U(at), _U(at + min(1, last) * k), _U(at + min(2, last) * k), _U(at + min(3, last) * k)


@numba.njit(**_sums)
def _dots4(a, at, k, last, w, wt, lo, hi, out):
    """out[r] <- the dot product over ``q`` in ``[lo, hi)`` of ``a[at + min(r, last) * k +
    q]`` (float64; r = 0..3: four rows, the rows past ``last`` repeating it, for a group of
    2 or 3) with ``w[wt + q]`` (float32, or float64: the block norms), each in any order:
    a load of ``w`` serves four rows."""
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    a0, a1, a2, a3 = _rows4(at, k, last)
    for q in range(_U(lo), _U(hi)):
        x = np.float64(w[_U(wt) + q])
        s0 += a[a0 + q] * x
        s1 += a[a1 + q] * x
        s2 += a[a2 + q] * x
        s3 += a[a3 + q] * x
    out[0] = s0
    out[1] = s1
    out[2] = s2
    out[3] = s3


@numba.njit(**_sums)
def _dots4x2(a, at, k, last, w, wt, wk, lo, hi, out):
    """:func:`_dots4` for two columns, ``w[wt + q]`` and ``w[wt + wk + q]``: out[4 * c +
    r]; a load of ``a`` serves both."""
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    t0 = 0.0
    t1 = 0.0
    t2 = 0.0
    t3 = 0.0
    a0, a1, a2, a3 = _rows4(at, k, last)
    w0, w1 = _U(wt), _U(wt + wk)
    for q in range(_U(lo), _U(hi)):
        x = np.float64(w[w0 + q])
        y = np.float64(w[w1 + q])
        b0, b1, b2, b3 = a[a0 + q], a[a1 + q], a[a2 + q], a[a3 + q]
        s0 += b0 * x
        s1 += b1 * x
        s2 += b2 * x
        s3 += b3 * x
        t0 += b0 * y
        t1 += b1 * y
        t2 += b2 * y
        t3 += b3 * y
    out[0] = s0
    out[1] = s1
    out[2] = s2
    out[3] = s3
    out[4] = t0
    out[5] = t1
    out[6] = t2
    out[7] = t3


@numba.njit(**_sums)
def _dot(a, at, w, wt, lo, hi):
    """The dot product over ``q`` in ``[lo, hi)`` of ``a[at + q]`` and ``w[wt + q]``
    (float64 / float32, or both float64), in any order."""
    s = 0.0
    for q in range(_U(lo), _U(hi)):
        s += a[_U(at) + q] * np.float64(w[_U(wt) + q])
    return s


#: columns of B a decode pass takes at a time: their float32 rows stay in the cache while
#: every group of four rows of A runs over them
DECODE_TILE = 32


@numba.njit(**_jit)
def _settled_here(a, at, w, wt, wstep, k, stage2, scratch):
    """Stages 2 and 3 (:func:`_settle`) of one element inside a stage-1 kernel: the ``k``
    exact products ``a[at + q] * w[wt + q * wstep]`` (float64 by float32) in q's order,
    ``stage2 = (g, two_ulp)`` as :func:`settle_pairs` takes them, into ``scratch`` (a
    float64 array of at least ``2 k + 2``): the bits :func:`settle_pairs` gives the same
    element, with no call back to Python for it."""
    g, two_ulp = stage2
    prods = scratch[:k]
    for q in range(k):
        prods[q] = a[at + q] * np.float64(w[wt + q * wstep])
    return _settle(prods, g, two_ulp, scratch[k:])


@numba.njit(**_jit, inline="always")
def _tile(a, w, ablk, bblk, dims, at, consts, out, n0, n1):
    """Stage 1 of :func:`decode_first_pass` for the columns ``[n0, n1)`` of one matrix:
    ``dims = (M, K, N, nblk)``; ``at``: the matrix's offsets in (a, w, lo / flags, ablk,
    bblk); ``out = (lo, flags, scratch)`` (scratch: for :func:`_settled_here`). Returns
    ``(how many differ, how many columns are not finite)``: the second counted where
    ``consts`` carries a norm (``(block, pre, post)``, block > 0: the columns' block norms
    are computed here, into ``bblk``, as each column is first read), else 0."""
    m_, k, n_, nblk = dims
    a_at, w_at, out_at, ablk_at, bblk_at = at
    chunk, pre, g, norm, stage2 = consts
    lo, flags, scratch = out
    part = np.empty(8)
    acc = np.empty(8)
    mags = np.empty(8)
    left = 0
    bad = 0
    m = 0
    while m < m_:
        rows = min(4, m_ - m)  # a group of 2 or 3 runs as 4, its last row repeated
        n = n0
        while n < n1:
            cols = 2 if rows > 1 and n + 2 <= n1 else 1
            if norm[0] > 0 and m == 0:  # the columns' norms, from the keys just read
                for c in range(cols):
                    col = (bblk_at + (n + c) * nblk) // nblk
                    bad += 0 if _norms_of(w, w_at + (n + c) * k, k, norm, None, bblk, col) else 1
            for k0 in range(0, k, chunk):
                k1 = min(k0 + chunk, k)
                if rows == 1:
                    part[0] = _dot(a, a_at + m * k, w, w_at + n * k, k0, k1)
                elif cols == 2:
                    _dots4x2(a, a_at + m * k, k, rows - 1, w, w_at + n * k, k, k0, k1, part)
                else:
                    _dots4(a, a_at + m * k, k, rows - 1, w, w_at + n * k, k0, k1, part)
                for c in range(cols):
                    for i in range(rows):
                        acc[4 * c + i] = part[4 * c + i] if k0 == 0 else acc[4 * c + i] + part[4 * c + i]
            if rows == 1:
                mags[0] = _dot(ablk, ablk_at + m * nblk, bblk, bblk_at + n * nblk, 0, nblk)
            elif cols == 2:
                _dots4x2(ablk, ablk_at + m * nblk, nblk, rows - 1, bblk, bblk_at + n * nblk, nblk, 0, nblk, mags)
            else:
                _dots4(ablk, ablk_at + m * nblk, nblk, rows - 1, bblk, bblk_at + n * nblk, 0, nblk, mags)
            for c in range(cols):
                for i in range(rows):
                    low, differ = _first(acc[4 * c + i], mags[4 * c + i], pre, g)
                    if differ and math.isfinite(acc[4 * c + i]):  # finite products: settle here
                        low = _settled_here(a, a_at + (m + i) * k, w, w_at + (n + c) * k, 1, k, stage2, scratch)
                        differ = False
                    at_ = out_at + (m + i) * n_ + n + c
                    lo[at_] = low
                    flags[at_] = differ
                    left += differ
            n += cols
        m += rows
    return left, bad


@numba.njit(**_jit)
def decode_first_pass(a, w, ablk, bblk, shape, wstride, consts, lo, flags, start, stop):
    """Stage 1 of ``a @ w^T`` per matrix, for the columns ``[start, stop)`` of all
    matrices (column ``c``: matrix ``c // N``, column ``c % N``), reading the float32
    ``w`` itself (a weight, or the attention's keys: a decode step's product is bound by
    reading them, and a float64 copy is twice the bytes): a (nb * M * K,) float64 (the
    prepared rows of A), w float32 (B's columns as rows, matrix ``i`` at ``i *
    wstride``), ablk (nb * M * nblk,) / bblk (nb * N * nblk,) float64 (their block norm
    bounds), ``shape = (nb, M, K, N)``, ``consts = (chunk, pre, g, norm, stage2)``; lo
    (nb * M * N,) float32 and flags bool as :func:`first_pass_flat` gives them, an element
    that differs settled here (:func:`_settled_here`, ``stage2 = (g, two_ulp)``: stages 2
    and 3) unless its sum is not finite (a non-finite value: left flagged). ``d`` as
    :func:`exact.dot64` bounds it: each ``chunk`` of K summed in any order (a product goes
    through at most ``chunk - 1`` additions), the chunks' sums added in order; the
    magnitude summed in any order (the ``pre`` inflation covers it, as it covers a BLAS
    call). ``norm``: ``(0, 0.0, 0.0)`` where ``bblk`` holds B's norms, or ``(block, pre,
    post)``: ``bblk`` is written here -- each column's norms as :func:`prepare_rows_dense`
    computes them, as the column is first read (the attention's keys: no pass over them
    before). Returns ``(how many differ, how many columns hold a non-finite value)``
    (the second 0 where the norms were given; where it is not 0 the results do not
    count: the caller takes the prepared path)."""
    nb, m_, k, n_ = shape
    nblk = ablk.shape[0] // (nb * m_)
    scratch = np.empty(2 * k + 2)  # stages 2 and 3 of an element that differs
    left = 0
    bad = 0
    for mat in range(start // n_, (stop - 1) // n_ + 1):
        at = (mat * m_ * k, mat * wstride, mat * m_ * n_, mat * m_ * nblk, mat * n_ * nblk)
        for n0 in range(max(start - mat * n_, 0), min(stop - mat * n_, n_), DECODE_TILE):
            n1 = min(n0 + DECODE_TILE, stop - mat * n_, n_)
            got = _tile(a, w, ablk, bblk, (m_, k, n_, nblk), at, consts, (lo, flags, scratch), n0, n1)
            left += got[0]
            bad += got[1]
    return left, bad


@numba.njit(**_jit, inline="always")
def _axpy4(a, at, keys, v, vt, vk, n, part):
    """part[j] += (a_0 v_0j + a_1 v_1j) + (a_2 v_2j + a_3 v_3j) over the ``keys`` (1 to
    4) consecutive weights ``a[at + i]`` and value rows ``v[vt + i * vk:]``, for j < n
    (float64 weights, float32 values: each product exact in float64). Four keys a pass:
    one load and store of ``part`` serve four products; the loop runs across columns,
    so it vectorises strict (no reduction to reorder)."""
    p0 = a[at]
    p1 = a[at + 1] if keys > 1 else 0.0
    p2 = a[at + 2] if keys > 2 else 0.0
    p3 = a[at + 3] if keys > 3 else 0.0
    r0 = _U(vt)
    r1 = _U(vt + min(1, keys - 1) * vk)  # a missing key reads row 0 again, weighted 0
    r2 = _U(vt + min(2, keys - 1) * vk)
    r3 = _U(vt + min(3, keys - 1) * vk)
    for j in range(_U(0), _U(n)):
        x0 = np.float64(v[r0 + j])
        x1 = np.float64(v[r1 + j])
        x2 = np.float64(v[r2 + j])
        x3 = np.float64(v[r3 + j])
        part[j] += (p0 * x0 + p1 * x1) + (p2 * x2 + p3 * x3)


#: the bits of a float32's magnitude, and the least of them that is not finite
_ABS32 = np.int32(0x7FFFFFFF)
_INF32 = 0x7F800000


@numba.njit(**_jit)
def _column_maxima(bits, vt, k, n, out):
    """out[j] <- the largest magnitude bits ``bits[vt + q * n + j] & 0x7fffffff`` over the
    K rows of one (K, N) float32 matrix given as its int32 bits (for non-negative floats
    the order of the bits is the order of the values; an integer maximum vectorises
    without fast-math); returns whether every value is finite (no magnitude bits reach
    inf's)."""
    out[:n] = 0
    q = 0
    while q < k:  # four rows a loop (a loop over 65 columns costs its set-up again)
        r0 = _U(vt + q * n)
        r1 = _U(vt + min(q + 1, k - 1) * n)  # past the last row: the last row again
        r2 = _U(vt + min(q + 2, k - 1) * n)
        r3 = _U(vt + min(q + 3, k - 1) * n)
        for j in range(_U(0), _U(n)):
            x = max(bits[r0 + j] & _ABS32, bits[r1 + j] & _ABS32)
            y = max(bits[r2 + j] & _ABS32, bits[r3 + j] & _ABS32)
            x = max(x, y)
            out[j] = x if x > out[j] else out[j]
        q += 4
    finite = True
    for j in range(n):
        finite = finite and out[j] < _INF32
    return finite


#: value columns a keyed pass accumulates at a time (float64 rows of this length stay
#: in L1)
KEYED_TILE = 128


@numba.njit(**_jit)
def keyed_first_pass(a, v, bits, vstride, shape, consts, lo, flags, start, stop):
    """Stage 1 of ``a (nb, M, K) @ v (nb, K, N)`` for the rows ``[start, stop)`` of all
    matrices (row ``r``: matrix ``r // M``, row ``r % M``), reading the float32 ``v``
    itself in its own layout -- the attention's value blocks, each matrix contiguous
    (rows of N values), matrix ``i`` at ``i * vstride`` of the flat buffer ``v``, ``bits``
    the same buffer as int32 -- with no float64 copy and no block norms: ``a`` (nb * M *
    K,) float64 (the prepared weights, flat), ``shape = (nb, M, K, N)``, ``consts =
    (chunk, pre, g, stage2)``; lo (nb * M * N,) float32 and flags bool as
    :func:`first_pass_flat` gives them, an element that differs settled here
    (:func:`_settled_here`: stages 2 and 3) unless its sum is not finite. ``d``: each
    ``chunk`` of K summed in any order (four keys a group, the groups in order: a tree
    in which no product meets more than ``chunk - 1`` additions), the chunks' sums added
    in order (the bound of :func:`exact.dot64`); the magnitude: ``(sum_k |a_k|) * max_k
    |v_kn|`` (an upper bound of ``sum_k |a_k v_kn|`` once ``pre`` --
    :func:`exact.inflation` of K -- covers its K - 1 additions and one product). Returns
    ``(how many differ, how many of the matrices read hold a non-finite value)``: where
    the second is positive the caller takes the prepared path (the zero-weight rule)."""
    nb, m_, k, n_ = shape
    chunk, pre, g, stage2 = consts
    scratch = np.empty(2 * k + 2)  # stages 2 and 3 of an element that differs
    tiles = (n_ + KEYED_TILE - 1) // KEYED_TILE
    width = (n_ + tiles - 1) // tiles
    part = np.empty(width)
    acc = np.empty(width)
    top = np.empty(n_, np.int32)
    top_values = top.view(np.float32)
    left = 0
    bad = 0
    mat = -1
    for r in range(start, stop):
        a_at = r * k
        if r // m_ != mat:
            mat = r // m_
            bad += 0 if _column_maxima(bits, mat * vstride, k, n_, top) else 1
        v_at = mat * vstride
        weight = 0.0
        for q in range(_U(a_at), _U(a_at + k)):
            weight += abs(a[q])
        for n0 in range(0, n_, width):
            w = min(width, n_ - n0)
            for k0 in range(0, k, chunk):
                part[:w] = 0.0
                for q in range(k0, min(k0 + chunk, k), 4):
                    keys = min(4, k0 + chunk - q, k - q)
                    _axpy4(a, a_at + q, keys, v, v_at + q * n_ + n0, n_, w, part)
                for j in range(_U(0), _U(w)):
                    acc[j] = part[j] if k0 == 0 else acc[j] + part[j]
            out_at, top_at = _U(r * n_ + n0), _U(n0)
            for j in range(_U(0), _U(w)):
                low, differ = _first(acc[j], weight * np.float64(top_values[top_at + j]), pre, g)
                lo[out_at + j] = low
                flags[out_at + j] = differ
                left += differ
            for j in range(w):  # the few that differ: settled here (finite values only)
                if flags[r * n_ + n0 + j] and math.isfinite(acc[j]):
                    lo[r * n_ + n0 + j] = _settled_here(a, a_at, v, v_at + n0 + j, n_, k, stage2, scratch)
                    flags[r * n_ + n0 + j] = False
                    left -= 1
    return left, bad


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


@numba.njit(**dict(_jit, fastmath={"reassoc"}))
def _row_squares(x, at, k, block, values, sums, r):
    """values[r * k:(r + 1) * k] <- x[at:at + k] (float32 -> float64, exact; values None:
    not stored, the norms alone), and sums[r * nblk:(r + 1) * nblk] <- each
    ``block``-long K-block's sum of squares, in whatever order vectorises (see the module
    docstring: reassociation is this loop's only flag). A block holding a non-finite value
    sums to a non-finite one (a finite float32's square cannot overflow float64)."""
    nblk = (k + block - 1) // block
    for bi in range(nblk):
        s = 0.0
        lo, hi = bi * block, min(bi * block + block, k)
        for q in range(_U(lo), _U(hi)):
            y = np.float64(x[_U(at) + q])
            if values is not None:
                values[_U(r * k) + q] = y
            s += y * y
        sums[r * nblk + bi] = s


@numba.njit(**_jit, inline="always")
def _norms_of(x, at, k, norm, flat_v, flat_b, r):
    """Row ``r``'s block norm bounds ``flat_b[r * nblk:][:nblk]`` (``sqrt(sum * pre) *
    post`` of each ``block``-long sum of squares by :func:`_row_squares`, ``norm = (block,
    pre, post)``) of the K float32 values ``x[at:at + k]`` (``flat_v``: their float64
    copy, or None); returns whether every block is finite (a row that is not: its bounds
    are not finite, the caller redoes or refuses it)."""
    block, pre, post = norm
    nblk = (k + block - 1) // block
    _row_squares(x, at, k, block, flat_v, flat_b, r)
    finite = True
    for i in range(r * nblk, r * nblk + nblk):
        finite = finite and math.isfinite(flat_b[i])
        flat_b[i] = math.sqrt(flat_b[i] * pre) * post
    return finite


@numba.njit(**_jit)
def prepare_rows_dense(x, mstride, shape, block, pre, post, flat_v, blocks, bad, start, stop):
    """:func:`prepare_rows` of rows ``[start, stop)`` for ``x`` given as a flat float32
    buffer whose matrices ``(M, K) = shape`` are each contiguous, matrix ``i`` at
    ``i * mstride`` (the attention's key blocks: slices of one tensor), into the fresh
    contiguous outputs (``flat_v``: the values, flat, or None: the norms and flags
    alone): a row's conversion and block sums by :func:`_row_squares`, then its blocks'
    norm bounds; a row with a non-finite block is redone by the checked loop (its entries
    taken as 0, the row flagged). The same values and flags as :func:`prepare_rows`, and
    bounds valid for any order of the sums. Returns how many rows are flagged."""
    m, k = shape
    nblk = (k + block - 1) // block
    flat_b, flat_bad = blocks.reshape(-1), bad.reshape(-1)
    nbad = 0
    for r in range(start, stop):
        at = (r // m) * mstride + (r % m) * k
        finite = _norms_of(x, at, k, (block, pre, post), flat_v, flat_b, r)
        flat_bad[r] = not finite
        if not finite:
            for b0 in range(0, k, block):
                sq = 0.0
                for q in range(b0, min(b0 + block, k)):
                    v = np.float64(x[at + q])
                    v = v if math.isfinite(v) else 0.0
                    if flat_v is not None:
                        flat_v[r * k + q] = v
                    sq += v * v
                flat_b[r * nblk + b0 // block] = math.sqrt(sq * pre) * post
            nbad += 1
    return nbad


@numba.njit(**_jit)
def prepare_cols_dense(x, mstride, shape, block, pre, post, values, blocks, col_bad, row_bad, start, stop):
    """:func:`prepare_cols` of matrices ``[start, stop)`` for ``x`` given as a flat
    float32 buffer whose matrices ``(K, N) = shape`` are each contiguous, matrix ``i`` at
    ``i * mstride``, into the fresh contiguous outputs: each K-row converted and squared
    into its columns' sums (no reduction inside the loop: it vectorises as written, in
    :func:`prepare_cols`'s order, the same bits); a matrix with a non-finite sum is redone
    with its flags by the checked loop. Returns how many columns are flagged."""
    k, n = shape
    nblk = (k + block - 1) // block
    flat_v, flat_b = values.reshape(-1), blocks.reshape(-1)
    sq = np.empty(n, np.float64)
    nbad = 0
    for mat in range(start, stop):
        finite = True
        for bi in range(nblk):
            out = _U((mat * nblk + bi) * n)
            for j in range(_U(0), _U(n)):
                flat_b[out + j] = 0.0
            for q in range(bi * block, min(bi * block + block, k)):
                src, dst = _U(mat * mstride + q * n), _U((mat * k + q) * n)
                for j in range(_U(0), _U(n)):
                    y = np.float64(x[src + j])
                    flat_v[dst + j] = y
                    flat_b[out + j] += y * y
            for j in range(_U(0), _U(n)):
                s = flat_b[out + j]
                finite = finite and math.isfinite(s)
                flat_b[out + j] = math.sqrt(s * pre) * post
        for j in range(n):
            col_bad[mat, j] = False
        for q in range(k):
            row_bad[mat, q] = False
        if finite:
            continue
        for b0 in range(0, k, block):
            for j in range(n):
                sq[j] = 0.0
            for q in range(b0, min(b0 + block, k)):
                for j in range(n):
                    v = np.float64(x[mat * mstride + q * n + j])
                    if not math.isfinite(v):
                        row_bad[mat, q] = True
                        col_bad[mat, j] = True
                        v = 0.0
                    flat_v[(mat * k + q) * n + j] = v
                    sq[j] += v * v
            for j in range(n):
                flat_b[(mat * nblk + b0 // block) * n + j] = math.sqrt(sq[j] * pre) * post
        for j in range(n):
            nbad += col_bad[mat, j]
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
