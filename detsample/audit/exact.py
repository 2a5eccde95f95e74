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
#: elements per pass: each bin's float64 partial sum of <= 2**14 integers below 2**27
#: stays an exact integer, and the temporaries stay small (cache-resident, no page faults)
_BLOCK = 1 << 14
_HI = 2.0 ** 27  # a frexp mantissa m in [0.5, 1): m * 2**27 = hi + lo * 2**-26, both integers
_LO = 2.0 ** 26


def exact_sums(x: np.ndarray, groups: np.ndarray | None = None, ngroups: int = 1,
               check: bool = True) -> list[int]:
    """Exact per-group sums of finite float64 values, as integers scaled by ``2**1074``.

    x: float64 [N], all finite (ValueError otherwise; ``check=False`` skips the test for
    callers that already made it). groups: int [N] in [0, ngroups), or None for a single
    group. Returns ``ngroups`` Python ints ``S_g`` with
    ``sum(x[groups == g]) == S_g * 2**-1074`` exactly (no rounding anywhere).
    """
    if groups is None:
        return exact_marginal_sums(x, None, (1,), check)[0]
    return exact_marginal_sums(x, groups, (ngroups,), check)[0]


def exact_marginal_sums(x: np.ndarray, groups: np.ndarray | None, shape: tuple[int, ...],
                        check: bool = True) -> list[list[int]]:
    """Exact sums of ``x`` per joint group, marginalised: for groups that index a grid of
    ``shape`` (row-major, the last axis fastest), returns for each axis but the last the
    sums per (index on that axis, index on the last axis), flattened: e.g. with shape
    (A, B, 2) two lists, of A*2 and B*2 sums. With one axis, the sums per group.

    Vectorised, in blocks: ``np.frexp`` splits each value into a mantissa m in [0.5, 1)
    and an exponent; ``t = m * 2**27`` splits exactly into ``hi = floor(t)`` (|hi| <=
    2**27) and ``lo = (t - hi) * 2**26`` (an integer in [0, 2**26)), so
    ``x = (hi * 2**26 + lo) * 2**(exp - 53)``. Both parts are summed per (group,
    exponent) with ``np.bincount`` and then over the other axes; every partial sum stays
    below ``2**53`` (2**14 values per block, 2**10 grid cells at most), so the float64
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
        mant, ex = np.frexp(x[start:start + _BLOCK])
        t = mant * _HI
        hi = np.floor(t)
        t -= hi
        t *= _LO  # lo
        lo_e = int(ex.min())
        width = int(ex.max()) - lo_e + 1
        key = (ex - lo_e).astype(np.intp)
        if groups is not None:
            key += groups[start:start + _BLOCK].astype(np.intp) * width
        both = np.stack([np.bincount(key, weights=hi, minlength=size * width),
                         np.bincount(key, weights=t, minlength=size * width)])
        grid = both.reshape((2,) + tuple(shape) + (width,))
        for a, out in zip(axes, outs):
            if a is None:
                marg = grid.reshape(2, size, width)
            else:
                other = tuple(i + 1 for i in range(len(shape) - 1) if i != a)
                marg = grid.sum(axis=other).reshape(2, shape[a] * last, width) if other \
                    else grid.reshape(2, shape[a] * last, width)
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


_SIGN = np.uint64(1 << 63)


def _order_keys(v: np.ndarray) -> np.ndarray:
    """uint64 keys whose unsigned order is the numeric order of float64 ``v`` (no NaN;
    -0.0 must already be folded into +0.0)."""
    bits = v.view(np.uint64)
    return np.where(bits >= _SIGN, ~bits, bits | _SIGN)


def _from_keys(k: np.ndarray) -> np.ndarray:
    return np.where(k >= _SIGN, k & ~_SIGN, ~k).view(np.float64)


class ValueCounts:
    """Exact multiset of float64 values: sorted distinct values and their counts.

    Mergeable exactly (a multiset union, independent of order) and exact for quantiles.
    Values are kept as order-preserving uint64 keys of their bits; :meth:`add` only
    appends, and every ``_COMPACT_AT`` pending values are sorted and counted at once.
    Memory: 16 bytes per distinct value (8 per pending one).
    """

    _COMPACT_AT = 1 << 21

    def __init__(self) -> None:
        self.keys = np.empty(0, dtype=np.uint64)
        self.counts = np.empty(0, dtype=np.int64)
        self._raw: list[np.ndarray] = []  # pending keys, each counted once
        self._raw_size = 0
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []  # pending (keys, counts)

    def add(self, values: np.ndarray) -> None:
        """Add float64 values (no NaN; negative zero is folded into +0)."""
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size == 0:
            return
        if np.isnan(v).any():
            raise ValueError("ValueCounts holds numbers, got NaN")
        self._raw.append(_order_keys(v + 0.0))  # + 0.0 turns -0.0 into +0.0
        self._raw_size += v.size
        if self._raw_size >= self._COMPACT_AT:
            self._compact()

    def merge(self, other: "ValueCounts") -> None:
        other._compact()
        self._pending.append((other.keys, other.counts))
        if sum(k.size for k, _ in self._pending) >= self._COMPACT_AT:
            self._compact()

    def _compact(self) -> None:
        if not self._raw and not self._pending:
            return
        parts = [(self.keys, self.counts)] + self._pending
        if self._raw:
            raw = np.concatenate(self._raw) if len(self._raw) > 1 else self._raw[0]
            raw.sort()  # our own keys: sorted in place
            starts = np.flatnonzero(np.r_[True, raw[1:] != raw[:-1]])
            parts.append((raw[starts], np.diff(np.r_[starts, raw.size]).astype(np.int64)))
        self._raw, self._raw_size, self._pending = [], 0, []
        keys = np.concatenate([k for k, _ in parts])
        counts = np.concatenate([c for _, c in parts])
        order = np.argsort(keys, kind="stable")  # merges the sorted runs
        keys, counts = keys[order], counts[order]
        if keys.size:
            starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
            self.keys = keys[starts]
            self.counts = np.add.reduceat(counts, starts)
        else:
            self.keys, self.counts = keys, counts

    def __getstate__(self) -> dict:
        self._compact()
        return {"keys": self.keys, "counts": self.counts}

    def __setstate__(self, state: dict) -> None:
        self.keys, self.counts = state["keys"], state["counts"]
        self._raw, self._raw_size, self._pending = [], 0, []

    @property
    def total(self) -> int:
        self._compact()
        return int(self.counts.sum())

    def values(self) -> np.ndarray:
        """The distinct values, ascending (float64)."""
        self._compact()
        return _from_keys(self.keys)

    def absolute(self) -> "ValueCounts":
        """The multiset of the absolute values (a new object)."""
        vals, counts = self.values(), self.counts
        out = ValueCounts()
        neg = vals < 0
        out._pending = [(_order_keys(-vals[neg][::-1] + 0.0), counts[neg][::-1]),
                        (_order_keys(vals[~neg]), counts[~neg])]
        out._compact()
        return out

    def value_at_ranks(self, ranks: np.ndarray, zeros: int = 0) -> np.ndarray:
        """The values at 0-based ``ranks`` of the sorted multiset plus ``zeros`` extra
        zeros (placed after the negative values)."""
        self._compact()
        ranks = np.asarray(ranks, dtype=np.int64)
        vals = self.values()
        nneg = int(self.counts[vals < 0].sum())
        cum = np.cumsum(self.counts)
        shifted = np.where(ranks >= nneg, ranks - zeros, ranks)
        idx = np.searchsorted(cum, shifted, side="right")
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
        q = np.asarray(qs, dtype=np.float64)
        virtual = (n - 1) * q  # numpy's _compute_virtual_index for "linear"
        prev = np.floor(virtual)
        gamma = virtual - prev
        prev_i = prev.astype(np.int64)
        next_i = np.minimum(prev_i + 1, n - 1)
        a = self.value_at_ranks(prev_i, zeros)
        b = self.value_at_ranks(next_i, zeros)
        with np.errstate(over="ignore", invalid="ignore"):  # r = exp(d) may overflow
            if transform is not None:
                a, b = transform(a), transform(b)
            diff = b - a  # numpy's _lerp, including its t >= 0.5 branch
            res = a + diff * gamma
            res = np.where(gamma >= 0.5, b - diff * (1 - gamma), res)
        return [float(v) for v in res]

    def histogram(self, edges: np.ndarray) -> np.ndarray:
        """Exact counts of values in [edges[i], edges[i+1]) (the last bin closed)."""
        vals = self.values()
        idx = np.searchsorted(edges, vals, side="right") - 1
        idx = np.where(vals == edges[-1], len(edges) - 2, idx)
        ok = (idx >= 0) & (idx < len(edges) - 1)
        return np.bincount(idx[ok], weights=self.counts[ok], minlength=len(edges) - 1).astype(np.int64)
