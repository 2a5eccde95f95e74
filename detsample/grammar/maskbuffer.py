"""Masked logits at the cost of the tokens that change, not of B x V selects.

A grammar row's bitmask is nearly always very sparse (a JSON structure position: a few
allowed tokens), very dense (inside a string: all but a few hundred) or, inside a
number over a digit-rich vocabulary, a mix (a tenth allowed); and the same grammar state
comes back step after step. :class:`MaskedLogitsBuffer` keeps one persistent (B, V)
float32 result buffer and, for each of its rows, the columns that hold a finite value;
the rest of a sparse row is already ``-inf`` from the previous step:

* a sparse row (<= 3% allowed) resets last step's columns to ``-inf`` (nothing to reset
  when the state repeats) and copies its allowed columns; rows in one state share one
  gather and one scatter;
* a dense row (<= 3% disallowed) copies the logits row and writes ``-inf`` on its
  disallowed columns;
* any other masked row ("select") is one streaming add of a cached row holding ``-0.0``
  on allowed and ``-inf`` on disallowed columns: ``x + (-0.0)`` is ``x`` bit for bit
  (``-0.0`` included) and ``x + (-inf)`` is ``-inf`` for every ``x`` but ``+inf`` and
  NaN, which the row maximum of the result reveals (a NaN); such a row is redone with
  the plain select. A row at a time: its maximum and its values at the allowed
  columns are read right after the add, while the row is in cache;
* a row without a grammar copies the logits row.

Each sparse and select row's allowed columns and the values the result holds there are
reported (:attr:`MaskedLogitsBuffer.columns`, :attr:`MaskedLogitsBuffer.values`): the
sampler draws such rows over those columns alone (:mod:`detsample.ops.colcdf`).

The entries come from a small cache keyed by the bitmask words themselves (a cheap
fingerprint, confirmed by an exact comparison), so an unchanged grammar state costs a
lookup. The result is bit for bit the select ``where(allowed, logits, -inf)`` of
:func:`detsample.ops.mask.masked_logits` (tests compare the two).

Row maxima come out for free or for one streaming max: a sparse row's maximum is the
maximum of the values it copied; a dense row keeps the unmasked maximum when no
disallowed logit reaches it; a select row is reduced once (numpy). Where a tie between
``+0.0`` and ``-0.0`` could make the sign depend on the reduction order, the row is
reduced with ``torch.amax`` like the sampler's own sanitising.

The buffer is handed to the sampler as the masked logits; callers may add finite values
to it in place (a logit bias) -- ``-inf`` stays ``-inf`` -- but must not write anything
else into it.
"""

from __future__ import annotations

import sys
from collections import OrderedDict

import numpy as np
import torch

#: A row is "sparse" when at most this fraction of its tokens is allowed, "dense" when at
#: most this fraction is disallowed; in between it is a "select" row (one streaming add).
#: A gather and scatter of the allowed columns beats the streaming add (plus its max)
#: up to a few percent of V: beyond that it touches every cache line of the row anyway.
SPARSE_MAX = 0.03
#: Bytes of cached column lists and additive rows kept (least recently used dropped).
CACHE_BYTES = 64 << 20
_NEG_INF = float("-inf")


class _Entry:
    """One bitmask row: ``kind`` "sparse" (``cols`` allowed), "dense" (``cols``
    disallowed) or "select" (``add``: (n,) float32, ``-0.0`` allowed, ``-inf`` not;
    ``allowed``: its allowed columns, ascending)."""

    __slots__ = ("words", "kind", "cols", "add", "n", "allowed")

    def __init__(
        self, words: np.ndarray, kind: str, cols: np.ndarray | None, add: np.ndarray | None = None, n: int = 0
    ) -> None:
        self.words, self.kind, self.cols, self.add, self.n = words, kind, cols, add, n
        self.allowed = None if add is None else np.flatnonzero(~np.isneginf(add))

    @property
    def sparse(self) -> bool:
        return self.kind == "sparse"

    @property
    def blocked(self) -> np.ndarray | None:
        """A select row's disallowed columns as a bool row (None for other kinds)."""
        return None if self.add is None else np.isneginf(self.add)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.words, self.cols, self.add, self.allowed) if a is not None)


class ColumnCache:
    """Bitmask row -> :class:`_Entry`, an LRU of at most ``capacity`` entries and
    ``max_bytes`` bytes; columns >= ``n`` (the grammar's vocabulary size) are never
    listed."""

    def __init__(self, capacity: int = 256, max_bytes: int = CACHE_BYTES) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._map: OrderedDict[tuple[int, int], list[_Entry]] = OrderedDict()
        self._weights: np.ndarray | None = None
        self._scratch: np.ndarray | None = None
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def fingerprints(self, words: np.ndarray) -> np.ndarray:
        """One uint64 per row: a fixed random linear form of the words (pairs of words
        as uint64 when the width is even), wrapping; collisions are resolved by an
        exact comparison."""
        v = words.view(np.uint64) if words.shape[1] % 2 == 0 else words.view(np.uint32)
        w = v.shape[1]
        if self._weights is None or self._weights.shape[0] != w:
            self._weights = np.random.default_rng(0x5EED).integers(0, 2**63, size=w, dtype=np.uint64) * np.uint64(
                2
            ) + np.uint64(1)
        if (
            self._scratch is None or self._scratch.shape[1] != w or self._scratch.shape[0] < v.shape[0]
        ):  # reused: no page faults per step
            self._scratch = np.empty((v.shape[0], w), dtype=np.uint64)
        prod = np.multiply(v, self._weights, out=self._scratch[: v.shape[0]])
        return prod.sum(axis=1, dtype=np.uint64)

    def lookup_rows(self, words: np.ndarray, rows: list[int], n: int, guess: list | None = None) -> dict[int, _Entry]:
        """``{row: entry}`` for bitmask ``words[row]`` of each row: one lookup per distinct
        mask (rows in one grammar state share it), confirmed for every row at once.

        ``guess[row]``: an entry the row probably has (its last step's: grammar states
        repeat), or None. Rows whose words equal their guess's skip the fingerprint; the
        others are looked up. Any guess is safe (the comparison is exact).
        """
        if not rows:
            return {}
        every = len(rows) == words.shape[0]  # rows ascending and distinct: all of them
        sub = words if every else words[rows]
        out: dict[int, _Entry] = {}
        left = list(range(len(rows)))
        if guess is not None:
            left = self._confirm_guesses(sub, rows, n, guess, out)
            if not left:
                return out
        part = sub if len(left) == len(rows) else sub[left]
        groups: dict[int, list[int]] = {}
        for i, fp in enumerate(self.fingerprints(part).tolist()):
            groups.setdefault(fp, []).append(i)
        for fp, group in groups.items():
            e = self.lookup(fp, part[group[0]], n)
            if len(group) == 1:
                out[rows[left[group[0]]]] = e
                continue
            same = ((part if len(group) == len(left) else part[group]) == e.words).all(axis=1)
            for i, ok in zip(group, same.tolist()):
                out[rows[left[i]]] = e if ok else self.lookup(fp, part[i], n)
        return out

    def _confirm_guesses(
        self, sub: np.ndarray, rows: list[int], n: int, guess: list, out: dict[int, _Entry]
    ) -> list[int]:
        """Rows (positions in ``rows``) whose words equal their guess go into ``out``; the
        others are returned."""
        by_entry: dict[int, list[int]] = {}
        left = []
        for i, r in enumerate(rows):
            e = guess[r] if r < len(guess) else None
            if e is None or e.n != n or e.words.shape[0] != sub.shape[1]:
                left.append(i)
            else:
                by_entry.setdefault(id(e), []).append(i)
        for members in by_entry.values():
            e = guess[rows[members[0]]]
            part = sub if len(members) == len(rows) else sub[members]
            for i, ok in zip(members, (part == e.words).all(axis=1).tolist()):
                if ok:
                    out[rows[i]] = e
                    self.hits += 1
                else:
                    left.append(i)
        left.sort()
        return left

    def lookup(self, fp: int, row: np.ndarray, n: int) -> _Entry:
        key = (int(fp), n)
        bucket = self._map.get(key)
        if bucket is not None:
            for e in bucket:
                if np.array_equal(e.words, row):
                    self._map.move_to_end(key)
                    self.hits += 1
                    return e
        self.misses += 1
        e = _classify(row, n)
        self._map.setdefault(key, []).append(e)
        self._map.move_to_end(key)
        self._bytes += e.nbytes
        while len(self._map) > 1 and (len(self._map) > self.capacity or self._bytes > self.max_bytes):
            _, dropped = self._map.popitem(last=False)
            self._bytes -= sum(d.nbytes for d in dropped)
        return e


def _set_bits(words: np.ndarray, n: int, most: float) -> np.ndarray | None:
    """Sorted columns < n of the set bits of ``words`` (int32 row), or None when there
    are more than ``most`` (decided from the nonzero words first: no full unpack)."""
    nz = np.flatnonzero(words)
    if nz.size > most:
        return None
    bits = np.unpackbits(words[nz].view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")
    i, b = np.nonzero(bits)
    cols = nz[i].astype(np.int64) * 32 + b
    cols = cols[cols < n]
    return cols if cols.size <= most else None


def _classify(row: np.ndarray, n: int) -> _Entry:
    """The cache entry of one bitmask row (sparse and dense found without unpacking the
    whole row)."""
    most = SPARSE_MAX * n
    cols = _set_bits(row, n, most)
    if cols is not None:
        return _Entry(row.copy(), "sparse", cols, n=n)
    cols = _set_bits(~row, n, most)
    if cols is not None:
        return _Entry(row.copy(), "dense", cols, n=n)
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:n].view(np.bool_)
    add = np.where(bits, np.float32(-0.0), np.float32(_NEG_INF)).astype(np.float32)
    return _Entry(row.copy(), "select", None, add, n=n)


class MaskedLogitsBuffer:
    """The persistent result buffer of the grammar mask (CPU, float32, contiguous).

    Everything runs in numpy: single-threaded, so no OpenMP barrier (on a busy 2-core
    host a 2-thread ``index_fill_`` of 64k entries costs 50x a 1-thread one, and 64
    2-thread row adds 100x 64 numpy ones).
    """

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None
        self._finite: list[np.ndarray | None] = []  # per row: columns not -inf, or None
        self._last: list[_Entry | None] = []  # per row: last step's entry (a lookup guess)
        self.cache = ColumnCache()
        #: of the last :meth:`apply`: ``{row: allowed columns}`` (int64, ascending) of the
        #: masked rows outside of which the result row is all ``-inf`` (every masked row
        #: but the dense ones, whose allowed columns are not listed), and ``{row: the
        #: result's float32 values at those columns}`` (read while they were in cache)
        self.columns: dict[int, np.ndarray] = {}
        self.values: dict[int, np.ndarray] = {}

    @staticmethod
    def supports(logits: torch.Tensor) -> bool:
        return (
            logits.device.type == "cpu"
            and logits.dtype == torch.float32
            and logits.dim() == 2
            and logits.is_contiguous()
            and sys.byteorder == "little"
        )  # (bitmask words read as bytes)

    def _rows(self, b: int, v: int) -> torch.Tensor:
        buf = self._buf
        if buf is None or buf.shape[1] != v or buf.shape[0] < b:
            buf = torch.empty((max(b, 1), v), dtype=torch.float32)
            self._buf = buf
            self._finite = [None] * buf.shape[0]
            self._last = [None] * buf.shape[0]
        return buf[:b]

    def apply(
        self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int], n: int, row_max: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(masked, maxima)``.

        logits: (B, V) float32 CPU contiguous (not modified); bitmask: (>= B, ceil(n/32))
        int32, row r for logits row r; rows: the masked rows (ascending); n <= V: tokens
        >= n are disallowed on masked rows. ``masked`` is this buffer's (B, V) view: the
        masked rows as ``where(allowed, logits, -inf)``, the others copied. ``maxima``
        (B, 1) float32 are ``torch.amax(masked, -1)`` when ``row_max`` (the (B, 1) maxima
        of ``logits``) is given, else None. :attr:`columns` lists the allowed columns of
        the sparse and select rows (the rest of such a row is ``-inf``), :attr:`values`
        the values ``masked`` holds there.
        """
        b, v = logits.shape
        out = self._rows(b, v)
        o, x = out.numpy(), logits.numpy()
        words = bitmask[:b].numpy()
        few, rest = _few_bits(words, rows, n, v)
        entries = self.cache.lookup_rows(words, rest, n, self._last)
        for r in few[0]:
            self._last[r] = None
        for r, e in entries.items():
            self._last[r] = e
        kinds: dict[str, list[int]] = {"sparse": [], "dense": [], "select": []}
        for r in rest:
            kinds[entries[r].kind].append(r)
        dense, select = kinds["dense"], kinds["select"]
        masked = set(rows)
        copied = [r for r in range(b) if r not in masked or r in entries and entries[r].kind == "dense"]
        _copy_rows(out, logits, copied)
        if dense:
            o.reshape(-1)[np.concatenate([entries[r].cols + r * v for r in dense])] = _NEG_INF
        values: dict[int, np.ndarray] = {}
        peaks = self._select_rows(out, logits, select, entries, n, values)
        if n < v and (dense or select):
            o[dense + select, n:] = _NEG_INF
        blocks = [few] if few[0] else []
        groups: dict[int, list[int]] = {}
        for r in kinds["sparse"]:
            groups.setdefault(id(entries[r]), []).append(r)
        for members in groups.values():
            cols = entries[members[0]].cols
            blocks.append(
                (members, [cols] * len(members), (np.asarray(members, dtype=np.int64)[:, None] * v + cols).ravel())
            )
        peaks.update(self._sparse_rows(o, x, blocks, v, values))
        for r in copied + select:
            self._finite[r] = None
        columns = dict(zip(few[0], few[1]))
        for r in kinds["sparse"]:
            columns[r] = entries[r].cols
        for r in select:
            columns[r] = entries[r].allowed
        self.columns, self.values = columns, values
        if row_max is None:
            return out, None
        return out, _maxima(out, logits, row_max, entries, peaks, n)

    def _select_rows(
        self, out: torch.Tensor, logits: torch.Tensor, select: list[int], entries: dict, n: int, values: dict
    ) -> dict[int, float]:
        """Select rows: ``logits + add`` over the first n columns, a row at a time so
        that its maximum and its values at the allowed columns (into ``values``) are read
        while the row is in cache. Returns each row's maximum over those columns; a row
        whose sum holds a NaN (a NaN or ``+inf`` logit) is redone with the plain select."""
        o, x = out.numpy(), logits.numpy()
        peaks: dict[int, float] = {}
        with np.errstate(invalid="ignore"):  # +inf + -inf: a NaN, redone below
            for r in select:
                e = entries[r]
                row = o[r, :n]
                np.add(x[r, :n], e.add, out=row)
                m = row.max()
                if m != m:  # NaN: the add is not the select here
                    np.copyto(row, x[r, :n])
                    np.copyto(row, _NEG_INF, where=e.blocked)
                    m = row.max()
                peaks[r] = float(m)
                values[r] = row.take(e.allowed)
        return peaks

    def _sparse_rows(self, o: np.ndarray, x: np.ndarray, blocks: list, v: int, values: dict) -> dict[int, float]:
        """Sparse rows, in blocks ``(rows, columns per row, flat index of all of them)``:
        last step's finite columns back to -inf (or the whole row when unknown), then
        the allowed columns copied, one gather and scatter per block. Returns each row's
        maximum (-inf without allowed columns)."""
        if not blocks:
            return {}
        flat_o, flat_x = o.reshape(-1), x.reshape(-1)
        stale = []
        for members, cols, _ in blocks:
            for r, c in zip(members, cols):
                prev = self._finite[r]
                if prev is None:
                    o[r].fill(_NEG_INF)
                elif prev is not c:  # the same state again: nothing to reset
                    stale.append(prev + r * v)
        if stale:
            flat_o[np.concatenate(stale)] = _NEG_INF
        peaks: dict[int, float] = {}
        for members, cols, idx in blocks:
            vals = flat_x[idx]
            flat_o[idx] = vals
            sizes = np.array([c.size for c in cols])
            if sizes[0] and (sizes == sizes[0]).all():  # one state: one reduce
                per_row = vals.reshape(len(members), -1)
                top = per_row.max(axis=1).tolist()
            else:  # one segmented reduce over the rows that have columns
                top = np.full(len(members), _NEG_INF, dtype=np.float32)
                some = sizes > 0
                starts = np.cumsum(sizes) - sizes
                if some.any():
                    top[some] = np.maximum.reduceat(vals, starts[some])
                top = top.tolist()
                per_row = [vals[a : a + k] for a, k in zip(starts.tolist(), sizes.tolist())]
            for r, c, m, val in zip(members, cols, top, per_row):
                peaks[r] = m
                self._finite[r] = c
                values[r] = val
        return peaks


def _few_bits(
    words: np.ndarray, rows: list[int], n: int, v: int
) -> tuple[tuple[list[int], list[np.ndarray], np.ndarray], list[int]]:
    """Split ``rows`` into those whose bitmask has only a few nonzero words (a structural
    position: a handful of allowed tokens, at most ``SPARSE_MAX`` of n) and the rest.
    The first come back as one sparse block ``(rows, allowed columns per row, flat
    index into a (B, v) buffer)``, read from the nonzero words of all of them at once
    (no per-row lookup: their states rarely repeat step after step); the rest go to the
    cache."""
    empty = ([], [], np.empty(0, dtype=np.int64))
    if not rows:
        return empty, []
    sub = words if len(rows) == words.shape[0] else words[rows]
    unit = 64 if sub.shape[1] % 2 == 0 else 32
    u = sub.view(np.uint64 if unit == 64 else np.uint32)
    nonzero = u != 0
    few = np.count_nonzero(nonzero, axis=1) * unit <= SPARSE_MAX * n
    pos = np.flatnonzero(few)
    if not pos.size:
        return empty, rows
    rest = [rows[i] for i in np.flatnonzero(~few).tolist()]
    ri, wi = np.divmod(np.flatnonzero(nonzero if pos.size == len(rows) else nonzero[pos]), u.shape[1])
    vals = u[pos[ri], wi]
    bi, bj = np.nonzero(np.unpackbits(vals.view(np.uint8).reshape(-1, unit // 8), axis=1, bitorder="little"))
    cols = wi[bi].astype(np.int64) * unit + bj
    ri = ri[bi]
    keep = cols < n
    if not keep.all():
        cols, ri = cols[keep], ri[keep]
    frows = [rows[i] for i in pos.tolist()]
    ends = np.cumsum(np.bincount(ri, minlength=pos.size)).tolist()
    per_row = [cols[a:z] for a, z in zip([0] + ends[:-1], ends)]
    return (frows, per_row, np.asarray(frows, dtype=np.int64)[ri] * v + cols), rest


def _runs(rows: list[int], key) -> list[tuple[int, int]]:
    """``[(start, stop)]`` positions of maximal runs of consecutive row ids in ``rows``
    with the same ``key(row)`` (compared by identity)."""
    runs, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i] != rows[i - 1] + 1 or key(rows[i]) is not key(rows[start]):
            runs.append((start, i))
            start = i
    return runs


def _copy_rows(out: torch.Tensor, logits: torch.Tensor, rows: list[int]) -> None:
    """``out[rows] = logits[rows]``, one slice copy per run of consecutive rows."""
    o, x = out.numpy(), logits.numpy()
    for start, stop in _runs(rows, lambda r: None):
        a, z = rows[start], rows[stop - 1] + 1
        np.copyto(o[a:z], x[a:z])


def _maxima(
    out: torch.Tensor, logits: torch.Tensor, row_max: torch.Tensor, entries: dict, peaks: dict, n: int
) -> torch.Tensor:
    """(B, 1) ``torch.amax(out, -1)``, from what the mask step already knows: ``peaks``
    holds the maxima of the sparse and select rows, ``entries`` the dense rows'
    disallowed columns."""
    m = row_max.clone()
    mn, x = m.numpy(), logits.numpy()
    dense = [(r, e) for r, e in entries.items() if r not in peaks]
    for r, got in list(peaks.items()) + [(r, None) for r, _ in dense]:
        exact = got is not None and bool(got != 0)
        if got is None:  # dense: unchanged when every disallowed logit is below the max
            e = entries[r]
            got = mn[r, 0]
            bad = x[r, e.cols]
            worst = max(bad.max() if bad.size else _NEG_INF, x[r, n:].max() if n < x.shape[1] else _NEG_INF)
            exact = bool(got != 0) and bool(worst < got)
            if not exact:  # a disallowed maximum: reduce the masked row
                got = out.numpy()[r].max()
                exact = bool(got != 0)
        if exact:
            mn[r, 0] = got
        else:  # a zero maximum: +0.0 or -0.0 is amax's choice
            m[r] = torch.amax(out[r : r + 1], dim=-1)
    return m
