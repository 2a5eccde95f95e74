"""numba kernel of :func:`detsample.ops.select.stable_topk` (imported on first use; it
imports numba): the first ``K`` entries of each float32 row in the order (value
descending, id ascending), i.e. the prefix of a stable descending sort, without sorting
the row.

A row of ``n`` values is cut into ``W = n // 8`` strided groups (``row[j + g W]``, g =
0..7: the groups of :func:`detsample.arith.jit.max8`, one vectorised pass); the K-th
largest group maximum ``t`` is at most the row's K-th largest value (K groups hold K
distinct elements at least that large), so the answer lies among the elements ``>= t``,
which only groups whose maximum is ``>= t`` (and the ``n % 8`` tail) hold. A min-heap of
K (value, id) pairs keeps the best of those, its order "smaller value first, and of equal
values the larger id first", so an entry leaves the heap before any entry that precedes
it in the stable order: what stays is exactly the stable order's first K, whatever
order the candidates came in. Comparisons only (no arithmetic): ``-0.0 == 0.0`` ties
as in a sort, ``-inf`` is a value like another. A row holding a NaN is flagged (the
caller takes torch's path: a sort places NaN first).
"""

from __future__ import annotations

import numba
import numpy as np

from detsample.arith.jit import max8

_jit = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)


@numba.njit(**_jit)
def _sift(hv, hi, i, v, idx, n):
    """Place (v, idx) into the hole at node ``i`` of the min-heap ``hv``/``hi`` of ``n``
    entries, moving smaller children up."""
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        r = c + 1
        if r < n and (hv[r] < hv[c] or (hv[r] == hv[c] and hi[r] > hi[c])):
            c = r
        if hv[c] < v or (hv[c] == v and hi[c] > idx):
            hv[i] = hv[c]
            hi[i] = hi[c]
            i = c
        else:
            break
    hv[i] = v
    hi[i] = idx


@numba.njit(inline="always", **_jit)
def _push(hv, hi, K, cnt, v, idx):
    """Offer (v, idx) to a heap holding ``cnt`` entries (filled, then heapified, up to
    K; then kept when it precedes the heap's last entry in the stable order). Returns
    the new count."""
    if cnt < K:
        hv[cnt] = v
        hi[cnt] = idx
        cnt += 1
        if cnt == K:
            for q in range(K // 2 - 1, -1, -1):
                _sift(hv, hi, q, hv[q], hi[q], K)
    elif v > hv[0] or (v == hv[0] and idx < hi[0]):
        _sift(hv, hi, 0, v, idx, K)
    return cnt


@numba.njit(**_jit)
def _heap_all(row, K, hv, hi):
    """The heap of the stable order's first K of a whole ``row`` (K <= row.size)."""
    cnt = 0
    for i in range(row.size):
        v = row[i]
        if cnt < K or v >= hv[0]:
            cnt = _push(hv, hi, K, cnt, v, i)


@numba.njit(**_jit)
def _topk_row(row, K, scratch, vals, ids):
    """One row's first K into ``vals`` / ``ids``; returns 1 when the row holds a NaN
    (then the outputs are unspecified). ``scratch`` = (hv, hi, buf)."""
    hv, hi, buf = scratch
    n = row.size
    W = n // 8
    nan = 0
    for i in range(n):
        nan |= np.int32(row[i] != row[i])
    if W < 2 * K:
        _heap_all(row, K, hv, hi)
    else:
        for j in range(W):
            buf[j] = max8(row, W, j)
        _heap_all(buf[:W], K, hv, hi)
        t = hv[0]  # the K-th largest group maximum: <= the row's K-th largest
        cnt = 0
        for j in range(W):
            if buf[j] >= t:
                for g in range(8):
                    v = row[g * W + j]
                    if v >= t:
                        cnt = _push(hv, hi, K, cnt, v, g * W + j)
        for i in range(8 * W, n):
            cnt = _push(hv, hi, K, cnt, row[i], i)
    for m in range(K, 0, -1):  # pop the smallest into the last free position
        vals[m - 1] = hv[0]
        ids[m - 1] = hi[0]
        _sift(hv, hi, 0, hv[m - 1], hi[m - 1], m - 1)
    return nan


@numba.njit(**_jit)
def topk_rows(x, K, out, span):
    """Rows ``span`` = (r0, r1) of a (rows, n) float32 ``x``: their first K (1 <= K <=
    n) in the stable descending order into ``out`` = (vals (rows, K) float32, ids (rows,
    K) int64, nan (rows,) int8: 1 where the row holds a NaN)."""
    vals, ids, nan = out
    r0, r1 = span
    scratch = (np.empty(K, dtype=np.float32), np.empty(K, dtype=np.int64), np.empty(x.shape[1] // 8, dtype=np.float32))
    for r in range(r0, r1):
        nan[r] = _topk_row(x[r], K, scratch, vals[r], ids[r])
