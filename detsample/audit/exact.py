"""Exact, mergeable accumulators for the audit: exact float sums and exact value counts.

The audit must give the same bits whether a file is read in one pass or sharded over
processes in chunks of any size. Float addition is not associative, so every sum the
audit reports is kept *exactly*: a float64 is an integer multiple of ``2**-1074``, so a
sum of float64 values is an integer multiple of ``2**-1074`` too, kept here as a Python
``int`` scaled by ``2**1074``. Adding two such integers is associative and commutative,
so any chunking and any merge order give the same integer, and the reported float is that
exact value rounded once (``Fraction -> float``, round-to-nearest-even).

Quantiles are exact too: :class:`ValueCounts` keeps every distinct value with its count
(sorted float64 bit patterns of non-negative values), so merging is a multiset union and
the quantile of the union is the quantile of all the values. Its memory is 16 bytes per
*distinct* value; exact zeros, the common case of an exact audit, cost nothing because
the caller counts them separately.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

SCALE_BITS = 1074  # every finite float64 is an integer multiple of 2**-1074
_BLOCK = 1 << 24  # elements per bincount pass: keeps each bin's float64 sum an exact integer
_HALF = 26  # mantissas (53 bits) are split into a signed high part and a 26-bit low part


def exact_sums(x: np.ndarray, groups: np.ndarray | None = None, ngroups: int = 1) -> list[int]:
    """Exact per-group sums of finite float64 values, as integers scaled by ``2**1074``.

    x: float64 [N], all finite (ValueError otherwise). groups: int [N] in [0, ngroups), or
    None for a single group. Returns ``ngroups`` Python ints ``S_g`` with
    ``sum(x[groups == g]) == S_g * 2**-1074`` exactly (no rounding anywhere).

    Vectorised: each value is split as ``x = mant * 2**(exp - 53)`` (``np.frexp``), the
    53-bit integer mantissa is split into two parts of <= 27 bits, and both parts are
    summed per (group, exponent) with ``np.bincount``: every partial sum stays below
    ``2**53``, so the float64 bin totals are exact integers. Only the few non-empty
    (group, exponent) bins are combined in Python.
    """
    x = np.ascontiguousarray(x, dtype=np.float64).ravel()
    if groups is not None:
        groups = np.asarray(groups, dtype=np.int64).ravel()
        if groups.shape != x.shape:
            raise ValueError(f"groups must have the shape of x {x.shape}, got {groups.shape}")
    if x.size and not np.isfinite(x).all():
        raise ValueError("exact_sums needs finite values; got inf or nan")
    out = [0] * ngroups
    for start in range(0, x.size, _BLOCK):
        xs = x[start:start + _BLOCK]
        mant, exp = np.frexp(xs)
        mi = (mant * 9007199254740992.0).astype(np.int64)  # * 2**53: exact integer
        shift = exp.astype(np.int64) + (SCALE_BITS - 53)  # x * 2**1074 == mi << shift
        sub = shift < 0  # subnormals: their low mantissa bits are zero, shift them out
        if sub.any():
            mi[sub] >>= -shift[sub]
            shift[sub] = 0
        nz = mi != 0
        if not nz.all():
            mi, shift = mi[nz], shift[nz]
            gs = None if groups is None else groups[start:start + _BLOCK][nz]
        else:
            gs = None if groups is None else groups[start:start + _BLOCK]
        if mi.size == 0:
            continue
        lo_s = int(shift.min())
        width = int(shift.max()) - lo_s + 1
        key = shift - lo_s if gs is None else gs * width + (shift - lo_s)
        nbins = ngroups * width
        hi_sum = np.bincount(key, weights=(mi >> _HALF).astype(np.float64), minlength=nbins)
        lo_sum = np.bincount(key, weights=(mi & ((1 << _HALF) - 1)).astype(np.float64),
                             minlength=nbins)
        used = np.flatnonzero((hi_sum != 0) | (lo_sum != 0))
        for k, h, lo in zip(used.tolist(), hi_sum[used].astype(np.int64).tolist(),
                            lo_sum[used].astype(np.int64).tolist()):
            g, s = divmod(k, width)
            out[g] += ((h << _HALF) + lo) << (s + lo_s)
    return out


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


class ValueCounts:
    """Exact multiset of non-negative float64 values: sorted distinct values and counts.

    Mergeable exactly (a multiset union, independent of order) and exact for quantiles.
    Values are stored as their IEEE bit patterns (uint64), whose order equals the
    numeric order for non-negative floats. Memory: 16 bytes per distinct value.
    """

    _COMPACT_AT = 1 << 20

    def __init__(self) -> None:
        self.keys = np.empty(0, dtype=np.uint64)
        self.counts = np.empty(0, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0

    def add(self, values: np.ndarray) -> None:
        """Add float64 values >= 0 (negative zero is folded into +0)."""
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size == 0:
            return
        if (v < 0).any() or np.isnan(v).any():
            raise ValueError("ValueCounts holds non-negative values only")
        bits = (v + 0.0).view(np.uint64)  # + 0.0 turns -0.0 into +0.0
        keys, counts = np.unique(bits, return_counts=True)
        self._push(keys, counts.astype(np.int64))

    def merge(self, other: "ValueCounts") -> None:
        other._compact()
        self._push(other.keys, other.counts)

    def _push(self, keys: np.ndarray, counts: np.ndarray) -> None:
        self._pending.append((keys, counts))
        self._pending_size += keys.size
        if self._pending_size >= self._COMPACT_AT:
            self._compact()

    def _compact(self) -> None:
        if not self._pending:
            return
        keys = np.concatenate([self.keys] + [k for k, _ in self._pending])
        counts = np.concatenate([self.counts] + [c for _, c in self._pending])
        self._pending, self._pending_size = [], 0
        order = np.argsort(keys, kind="stable")
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
        self._pending, self._pending_size = [], 0

    @property
    def total(self) -> int:
        self._compact()
        return int(self.counts.sum())

    def values(self) -> np.ndarray:
        """The distinct values, ascending (float64)."""
        self._compact()
        return self.keys.view(np.float64)

    def value_at_ranks(self, ranks: np.ndarray, zeros: int = 0) -> np.ndarray:
        """The values at 0-based ``ranks`` of the sorted multiset plus ``zeros`` extra zeros."""
        self._compact()
        ranks = np.asarray(ranks, dtype=np.int64)
        cum = np.cumsum(self.counts)
        idx = np.searchsorted(cum, ranks - zeros, side="right")
        vals = self.keys.view(np.float64)
        out = np.zeros(ranks.shape, dtype=np.float64)
        hit = ranks >= zeros
        out[hit] = vals[idx[hit]]
        return out

    def quantiles(self, qs: list[float], zeros: int = 0) -> list[float | None]:
        """Exact quantiles, bit-for-bit those of ``np.quantile(all_values, q)`` (method
        "linear"), of the multiset plus ``zeros`` extra zeros. None when empty."""
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
        diff = b - a  # numpy's _lerp, including its t >= 0.5 branch
        res = a + diff * gamma
        res = np.where(gamma >= 0.5, b - diff * (1 - gamma), res)
        return [float(v) for v in res]

    def histogram(self, edges: np.ndarray) -> np.ndarray:
        """Exact counts of values in [edges[i], edges[i+1]) (the last bin closed)."""
        self._compact()
        vals = self.keys.view(np.float64)
        idx = np.searchsorted(edges, vals, side="right") - 1
        idx = np.where(vals == edges[-1], len(edges) - 2, idx)
        ok = (idx >= 0) & (idx < len(edges) - 1)
        return np.bincount(idx[ok], weights=self.counts[ok], minlength=len(edges) - 1).astype(np.int64)
