"""The report's row tables: the first mismatching tokens and the first sequences, in file
order (bounded; exactly mergeable: shards merge in file order, so the tables are the same
for every ``workers``, chunk size and Ray).

``first_mismatches``: up to :data:`MAX_TOKEN_ROWS` tokens whose engine and trainer
logprobs differ in bits (after the compare dtype), each with its sequence's id, response
position, token id, engine and trainer logprob and d =
trainer - engine. ``sequences_table``: up to :data:`MAX_SEQUENCE_ROWS` sequences (by id) with their
audited tokens, exact matches, max |d|, sum of d and first divergence (None: none).
"""

from __future__ import annotations

import numpy as np

MAX_TOKEN_ROWS = 50
MAX_SEQUENCE_ROWS = 200


class RowTables:
    """Accumulates the two tables (see the module docstring)."""

    def __init__(self, compare_dtype: str | None) -> None:
        self.compare_dtype = compare_dtype
        self.tokens: list[dict] = []
        self.sequences: list[dict] = []

    def full(self) -> bool:
        return len(self.tokens) >= MAX_TOKEN_ROWS and len(self.sequences) >= MAX_SEQUENCE_ROWS

    def update(self, b) -> None:
        """Add the valid sequences of one :class:`~detsample.audit.inputs.table.AuditBatch`
        (only as many as the tables still take are read): the first sequences one by one
        while the sequence table takes them, then only the sequences holding a differing
        trained token (found for the whole batch at once: a batch of a million exact or
        empty sequences costs one vector pass, not a million Python calls)."""
        n, take = len(b), max(MAX_SEQUENCE_ROWS - len(self.sequences), 0)
        for i in range(min(take, n)):
            self._sequence(b, i)
        if n <= take or len(self.tokens) >= MAX_TOKEN_ROWS:
            return
        for i in self._differing(b, take):
            if len(self.tokens) >= MAX_TOKEN_ROWS:
                return
            self._sequence(b, i)

    def _bits_differ(self, e: np.ndarray, t: np.ndarray) -> tuple:
        """(e, t) in the compare dtype and whether their bits differ (after promotion)."""
        if self.compare_dtype is not None:
            e, t = e.astype(self.compare_dtype), t.astype(self.compare_dtype)
        common = np.result_type(e.dtype, t.dtype)
        ec, tc = e.astype(common), t.astype(common)
        return e, t, ec.view(f"u{common.itemsize}") != tc.view(f"u{common.itemsize}")

    def _differing(self, b, start: int) -> list[int]:
        """The sequences from ``start`` on with a trained token whose bits differ, in order."""
        lo = int(b.offsets[start])
        m = np.asarray(b.mask[lo:], dtype=bool)
        differ = self._bits_differ(b.engine[lo:], b.trainer[lo:])[2] & m
        tok = np.flatnonzero(differ) + lo
        return np.unique(np.searchsorted(b.offsets, tok, side="right") - 1).tolist()

    def _sequence(self, b, i: int) -> None:
        lo, hi = int(b.offsets[i]), int(b.offsets[i + 1])
        m = np.asarray(b.mask[lo:hi], dtype=bool)
        pos = np.flatnonzero(m)
        e, t, differ = self._bits_differ(b.engine[lo:hi][m], b.trainer[lo:hi][m])
        d = t.astype(np.float64) - e.astype(np.float64)
        where = {"id": b.ids[i]}  # the id only: the same rows from every format
        if len(self.sequences) < MAX_SEQUENCE_ROWS:
            self.sequences.append(
                {
                    **where,
                    "tokens": int(m.sum()),
                    "exact_matches": int((~differ).sum()),
                    "max_abs_diff": float(np.abs(d).max()) if d.size else None,
                    "sum_diff": float(d.sum()),
                    "first_divergence": int(pos[differ][0]) if differ.any() else None,
                }
            )
        ids = b.response_ids[lo:hi][m]
        for k in np.flatnonzero(differ)[: MAX_TOKEN_ROWS - len(self.tokens)].tolist():
            self.tokens.append(
                {
                    **where,
                    "position": int(pos[k]),
                    "token_id": int(ids[k]),
                    "engine_logprob": float(e[k]),
                    "trainer_logprob": float(t[k]),
                    "diff": float(d[k]),
                }
            )

    def merge(self, o: RowTables) -> None:
        """Add the tables of the shard after this one in file order."""
        self.tokens = (self.tokens + o.tokens)[:MAX_TOKEN_ROWS]
        self.sequences = (self.sequences + o.sequences)[:MAX_SEQUENCE_ROWS]

    def report(self) -> dict:
        return {"first_mismatches": list(self.tokens), "sequences_table": list(self.sequences)}
