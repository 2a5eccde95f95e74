"""Masked logits at the cost of the tokens that change, not of B x V selects.

A grammar row's bitmask is nearly always very sparse (a JSON structure position: a few
hundred allowed tokens) or very dense (inside a string: all but a few hundred), and the
same grammar state comes back step after step. :class:`MaskedLogitsBuffer` keeps one
persistent (B, V) float32 result buffer and, for each of its rows, the columns that hold
a finite value; the rest of a sparse row is already ``-inf`` from the previous step:

* a sparse row resets last step's columns to ``-inf`` and copies its allowed columns;
* a dense row copies the logits row and writes ``-inf`` on its disallowed columns;
* a row without a grammar copies the logits row.

The column lists come from a small cache keyed by the bitmask words themselves (a cheap
fingerprint, confirmed by an exact comparison), so an unchanged grammar state costs a
lookup. The result is bit for bit the select ``where(allowed, logits, -inf)`` of
:func:`detsample.ops.mask.masked_logits` (tests compare the two).

Row maxima come out for free: a sparse row's maximum is the maximum of the values it
copied; a dense row keeps the unmasked maximum when no disallowed logit reaches it.
Where a tie between ``+0.0`` and ``-0.0`` could make the sign depend on the reduction
order, the row is reduced with ``torch.amax`` like the sampler's own sanitising.

The buffer is handed to the sampler as the masked logits; callers may add finite values
to it in place (a logit bias) -- ``-inf`` stays ``-inf`` -- but must not write anything
else into it.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

#: A row is "sparse" when at most this fraction of its tokens is allowed.
SPARSE_MAX = 0.5
_NEG_INF = float("-inf")


class _Entry:
    __slots__ = ("words", "sparse", "cols")

    def __init__(self, words: np.ndarray, sparse: bool, cols: np.ndarray) -> None:
        self.words, self.sparse, self.cols = words, sparse, cols


class ColumnCache:
    """Bitmask row -> (sparse?, allowed or disallowed columns), an LRU of ``capacity``
    entries; columns >= ``n`` (the grammar's vocabulary size) are never listed."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._map: OrderedDict[tuple[int, int], list[_Entry]] = OrderedDict()
        self._weights: np.ndarray | None = None
        self.hits = 0
        self.misses = 0

    def fingerprints(self, words: np.ndarray) -> np.ndarray:
        """One int64 per row (a fixed random linear form; collisions are resolved by an
        exact comparison)."""
        w = words.shape[1]
        if self._weights is None or self._weights.shape[0] != w:
            self._weights = np.random.default_rng(0x5EED).integers(
                1, 2**62, size=w, dtype=np.int64)
        return words.astype(np.int64) @ self._weights

    def lookup_rows(self, words: np.ndarray, rows: list[int], n: int) -> dict[int, _Entry]:
        """``{row: entry}`` for bitmask ``words[row]`` of each row: one lookup per distinct
        mask (rows in one grammar state share it), confirmed for every row at once."""
        if not rows:
            return {}
        sub = words[rows]
        fps = self.fingerprints(sub)
        out: dict[int, _Entry] = {}
        for fp in np.unique(fps):
            group = np.flatnonzero(fps == fp)
            e = self.lookup(fp, sub[group[0]], n)
            same = (sub[group] == e.words).all(axis=1)
            for g, ok in zip(group.tolist(), same.tolist()):
                out[rows[g]] = e if ok else self.lookup(fp, sub[g], n)
        return out

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
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:n].view(np.bool_)
        sparse = int(np.count_nonzero(bits)) <= SPARSE_MAX * n
        e = _Entry(row.copy(), sparse, np.flatnonzero(bits if sparse else ~bits))
        self._map.setdefault(key, []).append(e)
        self._map.move_to_end(key)
        while len(self._map) > self.capacity:
            self._map.popitem(last=False)
        return e


class MaskedLogitsBuffer:
    """The persistent result buffer of the grammar mask (CPU, float32, contiguous).

    The scatter and gather run in numpy: single-threaded, so no OpenMP barrier (a
    2-thread ``index_fill_`` of 64k entries costs 50x a 1-thread one on a busy host).
    """

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None
        self._finite: list[np.ndarray | None] = []  # per row: columns not -inf, or None
        self.cache = ColumnCache()

    @staticmethod
    def supports(logits: torch.Tensor) -> bool:
        return (logits.device.type == "cpu" and logits.dtype == torch.float32
                and logits.dim() == 2 and logits.is_contiguous())

    def _rows(self, b: int, v: int) -> torch.Tensor:
        buf = self._buf
        if buf is None or buf.shape[1] != v or buf.shape[0] < b:
            buf = torch.empty((max(b, 1), v), dtype=torch.float32)
            self._buf = buf
            self._finite = [None] * buf.shape[0]
        return buf[:b]

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int], n: int,
              row_max: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(masked, maxima)``.

        logits: (B, V) float32 CPU contiguous (not modified); bitmask: (>= B, ceil(n/32))
        int32, row r for logits row r; rows: the masked rows (ascending); n <= V: tokens
        >= n are disallowed on masked rows. ``masked`` is this buffer's (B, V) view: the
        masked rows as ``where(allowed, logits, -inf)``, the others copied. ``maxima``
        (B, 1) float32 are ``torch.amax(masked, -1)`` when ``row_max`` (the (B, 1) maxima
        of ``logits``) is given, else None.
        """
        b, v = logits.shape
        out = self._rows(b, v)
        o, x = out.numpy(), logits.numpy()
        words = bitmask[:b].numpy()
        entries = self.cache.lookup_rows(words, rows, n)
        sparse = [r for r in rows if entries[r].sparse]
        copied = [r for r in range(b) if r not in entries or not entries[r].sparse]
        _copy_rows(o, x, copied)
        dense = [r for r in copied if r in entries]
        if dense:
            o.reshape(-1)[np.concatenate([entries[r].cols + r * v for r in dense])] = _NEG_INF
            if n < v:
                o[dense, n:] = _NEG_INF
        vals = self._sparse_rows(o, x, sparse, entries, v)
        for r in copied:
            self._finite[r] = None
        if row_max is None:
            return out, None
        return out, _maxima(out, logits, row_max, entries, vals, n)

    def _sparse_rows(self, o: np.ndarray, x: np.ndarray, sparse: list[int], entries: dict,
                     v: int) -> dict[int, np.ndarray]:
        """Sparse rows: last step's finite columns back to -inf (or the whole row when
        unknown), then the allowed columns copied. Returns the copied values per row."""
        if not sparse:
            return {}
        flat_o, flat_x = o.reshape(-1), x.reshape(-1)
        stale = []
        for r in sparse:
            prev = self._finite[r]
            if prev is None:
                o[r].fill(_NEG_INF)
            elif prev is not entries[r].cols:  # the same state again: nothing to reset
                stale.append(prev + r * v)
        if stale:
            flat_o[np.concatenate(stale)] = _NEG_INF
        idx = np.concatenate([entries[r].cols + r * v for r in sparse])
        vals = flat_x[idx]
        flat_o[idx] = vals
        out, pos = {}, 0
        for r in sparse:
            k = entries[r].cols.size
            out[r] = vals[pos:pos + k]
            pos += k
            self._finite[r] = entries[r].cols
        return out


def _copy_rows(o: np.ndarray, x: np.ndarray, rows: list[int]) -> None:
    """``o[rows] = x[rows]``, one slice copy per run of consecutive rows."""
    start = 0
    while start < len(rows):
        end = start
        while end + 1 < len(rows) and rows[end + 1] == rows[end] + 1:
            end += 1
        np.copyto(o[rows[start]:rows[end] + 1], x[rows[start]:rows[end] + 1])
        start = end + 1


def _maxima(out: torch.Tensor, logits: torch.Tensor, row_max: torch.Tensor, entries: dict,
            vals: dict, n: int) -> torch.Tensor:
    """(B, 1) ``torch.amax(out, -1)``, from what the mask step already knows."""
    m = row_max.clone()
    mn, x = m.numpy(), logits.numpy()
    for r, e in entries.items():
        if r in vals:  # sparse: the max of what was copied
            got = vals[r].max() if vals[r].size else np.float32(_NEG_INF)
            exact = bool(got != 0)
        else:  # dense: unchanged when every disallowed logit is below the max
            got = mn[r, 0]
            bad = x[r, e.cols]
            worst = max(bad.max() if bad.size else _NEG_INF,
                        x[r, n:].max() if n < x.shape[1] else _NEG_INF)
            exact = bool(got != 0) and bool(worst < got)
        if exact:
            mn[r, 0] = got
        else:  # a zero maximum (+0.0 vs -0.0) or a disallowed maximum: reduce
            m[r] = torch.amax(out[r:r + 1], dim=-1)
    return m
