"""Exact, mergeable accumulators for the audit: exact float sums and exact value counts.

The audit must give the same bits whether a file is read in one pass or sharded over
processes in chunks of any size. Float addition is not associative, so every sum the
audit reports is kept *exactly*: a float64 is an integer multiple of ``2**-1074``, so a
sum of float64 values is an integer multiple of ``2**-1074`` too, kept here as a Python
``int`` scaled by ``2**1074``. Adding two such integers is associative and commutative,
so any chunking and any merge order give the same integer, and the reported float is that
exact value rounded once (``Fraction -> float``, round-to-nearest-even).

Quantiles are exact too: :class:`ValueCounts` keeps every distinct value with its count
(sorted, as order-preserving keys of the float64 bits), so merging is a multiset union and
the quantile of the union is the quantile of all the values. Its memory is 16 bytes per
*distinct* value; exact zeros, the common case of an exact audit, cost nothing because
the caller counts them separately.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

SCALE_BITS = 1074  # every finite float64 is an integer multiple of 2**-1074
#: elements per pass: a (group, exponent) bin then sums <= 2**16 integers of magnitude
#: <= 2**27, and a marginal adds <= 2**10 such bins: every float64 partial sum stays an
#: exact integer (<= 2**53), and the temporaries stay small
_BLOCK = 1 << 16
_HI = 2.0**27  # a frexp mantissa m in [0.5, 1): m * 2**27 = hi + lo * 2**-26, both integers
_LO = 2.0**26


def exact_sums(x: np.ndarray, groups: np.ndarray | None = None, ngroups: int = 1, check: bool = True) -> list[int]:
    """Exact per-group sums of finite float64 values, as integers scaled by ``2**1074``.

    x: float64 [N], all finite (ValueError otherwise; ``check=False`` skips the test for
    callers that already made it). groups: int [N] in [0, ngroups), or None for a single
    group. Returns ``ngroups`` Python ints ``S_g`` with
    ``sum(x[groups == g]) == S_g * 2**-1074`` exactly (no rounding anywhere).
    """
    if groups is None:
        return exact_marginal_sums(x, None, (1,), check)[0]
    return exact_marginal_sums(x, groups, (ngroups,), check)[0]


def exact_marginal_sums(
    x: np.ndarray, groups: np.ndarray | None, shape: tuple[int, ...], check: bool = True
) -> list[list[int]]:
    """Exact sums of ``x`` per joint group, marginalised: for groups that index a grid of
    ``shape`` (row-major, the last axis fastest), returns for each axis but the last the
    sums per (index on that axis, index on the last axis), flattened: e.g. with shape
    (A, B, 2) two lists, of A*2 and B*2 sums. With one axis, the sums per group.

    Vectorised, in blocks: ``np.frexp`` splits each value into a mantissa m in [0.5, 1)
    and an exponent; ``t = m * 2**27`` splits exactly into ``hi = floor(t)`` (|hi| <=
    2**27) and ``lo = (t - hi) * 2**26`` (an integer in [0, 2**26)), so
    ``x = (hi * 2**26 + lo) * 2**(exp - 53)``. Both parts are summed per (group,
    exponent) with ``np.bincount`` and then over the other axes; every partial sum stays
    within ``2**53`` (2**16 values per block, 2**10 grid cells at most), so the float64
    totals are exact integers. Only the few non-empty (group, exponent) totals are
    combined in Python integers.
    """
    x = np.ascontiguousarray(x, dtype=np.float64).ravel()
    size = int(np.prod(shape))
    if size > 1 << 10:
        raise ValueError(f"at most 1024 groups, got shape {shape}")
    if groups is not None:
        groups = np.asarray(groups).ravel()
        if groups.shape != x.shape:
            raise ValueError(f"groups must have the shape of x {x.shape}, got {groups.shape}")
    if check and x.size and not np.isfinite(x).all():
        raise ValueError("exact_sums needs finite values; got inf or nan")
    axes = list(range(len(shape) - 1)) if len(shape) > 1 else [None]
    last = shape[-1]
    outs = [[0] * ((shape[a] if a is not None else 1) * last) for a in axes]
    for start in range(0, x.size, _BLOCK):
        mant, ex = np.frexp(x[start : start + _BLOCK])
        t = mant * _HI
        hi = np.floor(t)
        t -= hi
        t *= _LO  # lo
        lo_e = int(ex.min())
        width = int(ex.max()) - lo_e + 1
        key = (ex - lo_e).astype(np.intp)
        if groups is not None:
            key += groups[start : start + _BLOCK].astype(np.intp) * width
        both = np.stack(
            [np.bincount(key, weights=hi, minlength=size * width), np.bincount(key, weights=t, minlength=size * width)]
        )
        grid = both.reshape((2,) + tuple(shape) + (width,))
        for a, out in zip(axes, outs):
            if a is None:
                marg = grid.reshape(2, size, width)
            else:
                other = tuple(i + 1 for i in range(len(shape) - 1) if i != a)
                marg = (
                    grid.sum(axis=other).reshape(2, shape[a] * last, width)
                    if other
                    else grid.reshape(2, shape[a] * last, width)
                )
            used = np.argwhere((marg[0] != 0) | (marg[1] != 0))
            if not used.size:
                continue
            hs = marg[0][used[:, 0], used[:, 1]].astype(np.int64).tolist()
            ls = marg[1][used[:, 0], used[:, 1]].astype(np.int64).tolist()
            for (g, e), h, lo in zip(used.tolist(), hs, ls):
                shift = e + lo_e + (SCALE_BITS - 53)  # x * 2**1074 = (hi*2**26 + lo) << shift
                v = (h << 26) + lo
                out[g] += v << shift if shift >= 0 else v >> -shift  # subnormals: exact
    return outs


def exact_sum(x: np.ndarray) -> int:
    """The exact sum of finite float64 values, scaled by ``2**1074`` (see :func:`exact_sums`)."""
    return exact_sums(x)[0]


def to_fraction(scaled: int, count: int = 1) -> Fraction:
    """The exact rational ``scaled * 2**-1074 / count``."""
    return Fraction(scaled, count << SCALE_BITS)


def fraction_to_float(value: Fraction) -> float:
    """Round an exact rational to the nearest float64 (ties to even); +-inf on overflow."""
    try:
        return float(value)
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


def exact_mean(scaled: int, count: int) -> float | None:
    """``sum / count`` rounded once to float64, or None when ``count`` is 0."""
    if count == 0:
        return None
    return fraction_to_float(to_fraction(scaled, count))


def _lerp(a: np.ndarray, b: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """numpy's quantile interpolation (its _lerp, including the t >= 0.5 branch)."""
    with np.errstate(over="ignore", invalid="ignore"):  # r = exp(d) may overflow
        diff = b - a
        res = a + diff * gamma
        return np.where(gamma >= 0.5, b - diff * (1 - gamma), res)


def _virtual_ranks(qs: list[float], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(floor rank, next rank, gamma) of numpy's "linear" quantiles of n values."""
    virtual = (n - 1) * np.asarray(qs, dtype=np.float64)
    prev = np.floor(virtual)
    prev_i = prev.astype(np.int64)
    return prev_i, np.minimum(prev_i + 1, n - 1), virtual - prev


class ValueCounts:
    """Exact multiset of float64 values (no NaN; -0.0 counted as +0.0).

    :meth:`add` only appends (no work per value); the values are sorted once, when a
    quantile, a histogram or the distinct values are first asked for (``np.sort``, a
    vectorised quicksort). Mergeable exactly (a multiset union, independent of order).
    Memory: 8 bytes per value; past ``_COMPACT_AT`` values they are sorted and counted
    (16 bytes per *distinct* value).
    """

    _COMPACT_AT = 1 << 24

    def __init__(self) -> None:
        self._raw: list[np.ndarray] = []  # values, each counted once (unsorted)
        self._raw_size = 0
        self._sorted_raw: np.ndarray | None = None  # the raw values, sorted (a cache)
        self._distinct: list[tuple[np.ndarray, np.ndarray]] = []  # sorted (values, counts)

    def add(self, values: np.ndarray, check: bool = True) -> None:
        """Add float64 values. ``check=False``: the caller guarantees no NaN and no -0.0
        (the array is kept as is, not copied)."""
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size == 0:
            return
        if check:
            if np.isnan(v).any():
                raise ValueError("ValueCounts holds numbers, got NaN")
            v = v + 0.0  # + 0.0 turns -0.0 into +0.0
        self._raw.append(v)
        self._raw_size += v.size
        self._sorted_raw = None
        if self._raw_size >= self._COMPACT_AT:
            self._compact()

    def merge(self, other: ValueCounts) -> None:
        self._raw += other._raw
        self._raw_size += other._raw_size
        self._distinct += other._distinct
        self._sorted_raw = None
        if self._raw_size >= self._COMPACT_AT:
            self._compact()

    def _raw_sorted(self) -> np.ndarray:
        if self._sorted_raw is None:
            raw = np.concatenate(self._raw) if len(self._raw) != 1 else self._raw[0].copy()
            raw.sort()
            self._raw, self._sorted_raw = [raw], raw
        return self._sorted_raw

    def _compact(self) -> None:
        """Everything as one sorted (distinct values, counts) pair."""
        parts = list(self._distinct)
        if self._raw:
            raw = self._raw_sorted()
            starts = np.flatnonzero(np.r_[True, raw[1:] != raw[:-1]])
            parts.append((raw[starts], np.diff(np.r_[starts, raw.size]).astype(np.int64)))
        self._raw, self._raw_size, self._sorted_raw = [], 0, None
        if len(parts) <= 1:
            self._distinct = parts
            return
        vals = np.concatenate([v for v, _ in parts])
        counts = np.concatenate([c for _, c in parts])
        order = np.argsort(vals, kind="stable")  # merges the sorted runs
        vals, counts = vals[order], counts[order]
        starts = np.flatnonzero(np.r_[True, vals[1:] != vals[:-1]])
        self._distinct = [(vals[starts], np.add.reduceat(counts, starts))] if vals.size else []

    def _state(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(sorted values, their counts or None for one each)."""
        if not self._distinct:
            return (self._raw_sorted() if self._raw else np.empty(0)), None
        self._compact()
        if not self._distinct:
            return np.empty(0), None
        return self._distinct[0]

    def __getstate__(self) -> dict:
        raw = np.concatenate(self._raw) if self._raw else np.empty(0)
        return {"raw": raw, "distinct": self._distinct}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        if state["raw"].size:
            self._raw, self._raw_size = [state["raw"]], state["raw"].size
        self._distinct = list(state["distinct"])

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(the distinct values ascending, how often each occurs): one form whatever the
        history of adds and merges, so a function summed over it in this order gives the
        same bits for every chunking."""
        vals, counts = self._state()
        if counts is None:
            starts = np.flatnonzero(np.r_[True, vals[1:] != vals[:-1]]) if vals.size else np.zeros(0, dtype=np.int64)
            counts = np.diff(np.r_[starts, vals.size]).astype(np.int64)
            vals = vals[starts]
        return vals, counts

    @property
    def total(self) -> int:
        return self._raw_size + sum(int(c.sum()) for _, c in self._distinct)

    def values(self) -> np.ndarray:
        """The distinct values, ascending (float64)."""
        self._compact()
        return self._distinct[0][0] if self._distinct else np.empty(0)

    @property
    def counts(self) -> np.ndarray:
        """How often each of :meth:`values` occurs."""
        self._compact()
        return self._distinct[0][1] if self._distinct else np.empty(0, dtype=np.int64)

    def value_at_ranks(self, ranks: np.ndarray, zeros: int = 0) -> np.ndarray:
        """The values at 0-based ``ranks`` of the sorted multiset plus ``zeros`` extra
        zeros (placed after the negative values)."""
        vals, counts = self._state()
        ranks = np.asarray(ranks, dtype=np.int64)
        nneg = int(np.searchsorted(vals, 0.0)) if counts is None else int(counts[vals < 0].sum())
        shifted = np.where(ranks >= nneg, ranks - zeros, ranks)
        if counts is None:
            idx = np.clip(shifted, 0, max(vals.size - 1, 0))
        else:
            idx = np.searchsorted(np.cumsum(counts), shifted, side="right")
        out = np.zeros(ranks.shape, dtype=np.float64)
        hit = (ranks < nneg) | (ranks >= nneg + zeros)
        out[hit] = vals[idx[hit]]
        return out

    def quantiles(self, qs: list[float], zeros: int = 0, transform=None) -> list[float | None]:
        """Exact quantiles, bit-for-bit those of ``np.quantile(all_values, q)`` (method
        "linear"), of the multiset plus ``zeros`` extra zeros; with ``transform`` (a
        monotone non-decreasing ufunc such as ``np.exp``) those of
        ``np.quantile(transform(all_values), q)``. None when empty."""
        n = self.total + zeros
        if n == 0:
            return [None for _ in qs]
        prev_i, next_i, gamma = _virtual_ranks(qs, n)
        a = self.value_at_ranks(prev_i, zeros)
        b = self.value_at_ranks(next_i, zeros)
        if transform is not None:
            with np.errstate(over="ignore"):
                a, b = transform(a), transform(b)
        return [float(v) for v in _lerp(a, b, gamma)]

    def _halves(self):
        """The absolute values as two ascending runs with cumulative counts:
        (negatives reversed, their cumulative counts, non-negatives, theirs)."""
        vals, counts = self._state()
        k = int(np.searchsorted(vals, 0.0))
        ones = np.ones(vals.size, dtype=np.int64) if counts is None else counts
        a, ca = -vals[:k][::-1], np.cumsum(ones[:k][::-1])
        b, cb = vals[k:], np.cumsum(ones[k:])
        return a, ca, b, cb

    def abs_quantiles(self, qs: list[float], zeros: int = 0) -> list[float | None]:
        """:meth:`quantiles` of the absolute values (plus ``zeros`` zeros), from the two
        sorted halves without re-sorting: bit-equal to ``np.quantile(abs(values), q)``."""
        n = self.total + zeros
        if n == 0:
            return [None for _ in qs]
        a, ca, b, cb = self._halves()
        prev_i, next_i, gamma = _virtual_ranks(qs, n)

        def at(ranks: np.ndarray) -> np.ndarray:
            out = np.zeros(ranks.shape, dtype=np.float64)
            for j, r in enumerate((ranks - zeros).tolist()):
                if r >= 0:
                    out[j] = _kth_of_union(a, ca, b, cb, r)
            return out

        return [float(v) for v in _lerp(at(prev_i), at(next_i), gamma)]

    def abs_histogram(self, edges: np.ndarray) -> np.ndarray:
        """Exact counts of absolute values in [edges[i], edges[i+1]) (the last closed)."""
        a, ca, b, cb = self._halves()

        def below(v: np.ndarray, x: np.ndarray, c: np.ndarray, side: str) -> np.ndarray:
            idx = np.searchsorted(v, x, side=side)
            return np.where(idx > 0, c[np.maximum(idx - 1, 0)] if c.size else 0, 0)

        lo = below(a, edges, ca, "left") + below(b, edges, cb, "left")
        le_last = below(a, edges[-1:], ca, "right") + below(b, edges[-1:], cb, "right")
        counts = np.diff(lo)
        counts[-1] += int(le_last[0] - lo[-1])
        return counts.astype(np.int64)

    def histogram(self, edges: np.ndarray) -> np.ndarray:
        """Exact counts of values in [edges[i], edges[i+1]) (the last bin closed)."""
        vals, counts = self._state()
        c = np.ones(vals.size, dtype=np.int64) if counts is None else counts
        idx = np.searchsorted(edges, vals, side="right") - 1
        idx = np.where(vals == edges[-1], len(edges) - 2, idx)
        ok = (idx >= 0) & (idx < len(edges) - 1)
        return np.bincount(idx[ok], weights=c[ok], minlength=len(edges) - 1).astype(np.int64)


def _kth_of_union(a: np.ndarray, ca: np.ndarray, b: np.ndarray, cb: np.ndarray, k: int) -> float:
    """The k-th smallest (0-based) of two sorted runs with cumulative counts ca, cb."""

    def count_le(x: float) -> int:
        i, j = np.searchsorted(a, x, side="right"), np.searchsorted(b, x, side="right")
        return (int(ca[i - 1]) if i else 0) + (int(cb[j - 1]) if j else 0)

    best = np.inf
    for run in (a, b):  # the answer is the smallest value of either run with count_le > k
        lo, hi = 0, run.size
        while lo < hi:
            mid = (lo + hi) // 2
            if count_le(run[mid]) > k:
                hi = mid
            else:
                lo = mid + 1
        if lo < run.size:
            best = min(best, float(run[lo]))
    return best
