"""Per-row penalty state of a SamplingBatch: token counts, kept sparse on the host.

A row whose request has a penalty (``frequency_penalty``, ``presence_penalty`` or
``repetition_penalty`` not neutral) owns a :class:`RowTokens`: the distinct tokens it
has seen with their output counts, grown incrementally by ``advance`` (amortised O(1)
per token). Rows without a penalty own ``None``. A batch where no row has a penalty
holds no :class:`PenaltyState` at all, so it pays nothing and no ``(B, V)`` tensor
exists for penalties in any case: each step materialises the state as COO index
tensors of ``nnz = sum over penalised rows of |distinct seen tokens|`` entries
(see ``docs/perf/penalties.md`` for the measured comparison with a dense layout).

Counted tokens (vLLM's rule): frequency and presence count the request's output tokens
(its initial ``output_ids`` included); repetition uses prompt and output tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from detsample.ops.host import to_device
from detsample.params import Request, SamplingParams


class RowTokens:
    """Distinct seen tokens of one row and their output counts (host, numpy).

    ``cols[:n]`` int64 distinct token ids; ``counts[:n]`` int32 output counts (0 for a
    token seen in the prompt only). Prompt tokens are tracked only when the row has a
    repetition penalty (other penalties ignore them).
    """

    __slots__ = ("index", "cols", "counts", "n", "n_prompt", "freq", "pres", "rep")

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        self.freq = np.float32(params.frequency_penalty)
        self.pres = np.float32(params.presence_penalty)
        self.rep = np.float32(params.repetition_penalty)
        self.index: dict[int, int] = {}
        self.n = 0
        cap = 16
        self.cols = np.empty(cap, dtype=np.int64)
        self.counts = np.zeros(cap, dtype=np.int32)
        if self.rep != 1.0:
            for t in prompt_ids:
                self._slot(int(t))
        self.n_prompt = self.n  # slots below this index hold prompt tokens
        for t in output_ids:
            self.add(int(t))

    def _slot(self, t: int) -> int:
        i = self.index.get(t)
        if i is None:
            i = self.n
            if i == self.cols.shape[0]:
                self.cols = np.concatenate([self.cols, np.empty_like(self.cols)])
                self.counts = np.concatenate([self.counts, np.zeros_like(self.counts)])
            self.cols[i] = t
            self.index[t] = i
            self.n = i + 1
        return i

    def add(self, t: int) -> None:
        """Record one output token."""
        i = self._slot(t)  # may grow (replace) self.counts: index it only afterwards
        self.counts[i] += 1

    def remove(self, t: int) -> None:
        """Undo the last :meth:`add` of ``t`` (tokens are removed in the reverse order of
        their adds, so a slot whose count drops to 0 and holds no prompt token is the
        last slot, and dropping it restores the state before that add exactly)."""
        i = self.index.get(t)
        if i is None or self.counts[i] < 1:
            raise ValueError(f"rollback: token {t} has no recorded output occurrence")
        self.counts[i] -= 1
        if self.counts[i] == 0 and i >= self.n_prompt:
            if i != self.n - 1:
                raise ValueError(f"rollback: token {t} is not the last token recorded")
            del self.index[t]
            self.n = i

    def snapshot(self) -> dict[int, int]:
        """token -> output count, over every tracked token (for tests)."""
        return {int(c): int(k) for c, k in zip(self.cols[: self.n], self.counts[: self.n])}


class PenaltyState:
    """Row-aligned list of :class:`RowTokens` (``None`` for rows without penalties)."""

    def __init__(self, rows: list[RowTokens | None]) -> None:
        self.rows = rows
        self._coo: tuple[torch.Tensor, ...] | None = None

    # -- composition (called by SamplingBatch; these return the new state or None) ---
    @staticmethod
    def extend(
        state: PenaltyState | None, n_before: int, reqs: Sequence[Request], outputs: Sequence[Sequence[int]]
    ) -> PenaltyState | None:
        """Append rows for ``reqs`` (their current ``outputs``) after ``n_before`` rows."""
        new = [RowTokens(r.params, r.prompt_ids, o) if r.params.has_penalties else None for r, o in zip(reqs, outputs)]
        if state is None:
            if all(r is None for r in new):
                return None
            state = PenaltyState([None] * n_before)
        state.rows.extend(new)
        state._coo = None
        return state

    @staticmethod
    def filter(state: PenaltyState | None, idx: Sequence[int]) -> PenaltyState | None:
        if state is None:
            return None
        rows = [state.rows[i] for i in idx]
        return PenaltyState(rows) if any(r is not None for r in rows) else None

    @staticmethod
    def merge(
        state: PenaltyState | None, n_before: int, other: PenaltyState | None, n_other: int
    ) -> PenaltyState | None:
        """Append ``other``'s rows (its RowTokens are taken over, not shared: the other
        batch's state is copied so that advancing either batch cannot touch the other)."""
        if other is None:
            if state is not None:
                state.rows.extend([None] * n_other)
                state._coo = None
            return state
        if state is None:
            state = PenaltyState([None] * n_before)
        state.rows.extend(_copy_row(r) for r in other.rows)
        state._coo = None
        return state

    def advance(self, tokens: Sequence[int]) -> None:
        """Count each row's new token; ``-1`` (no admissible token) is not recorded."""
        for row, t in zip(self.rows, tokens):
            if row is not None and t >= 0:
                row.add(t)
        self._coo = None

    def rollback(self, removed: Sequence[Sequence[int]]) -> None:
        """Undo each row's last output tokens: ``removed[i]`` lists them, latest first."""
        for row, toks in zip(self.rows, removed):
            if row is not None:
                for t in toks:
                    row.remove(t)
        self._coo = None

    # -- per-step view ---------------------------------------------------------------
    def coo(self, device: torch.device) -> tuple[torch.Tensor, ...] | None:
        """``(rows, cols, counts, freq, pres, rep)`` for apply_penalties_coo_, or None."""
        if self._coo is None:
            live = [(i, r) for i, r in enumerate(self.rows) if r is not None and r.n]
            if not live:
                return None
            ns = np.array([r.n for _, r in live], dtype=np.int64)
            rows = np.repeat(np.array([i for i, _ in live], dtype=np.int64), ns)
            cols = np.concatenate([r.cols[: r.n] for _, r in live])
            counts = np.concatenate([r.counts[: r.n] for _, r in live])
            per = [
                np.repeat(np.array([getattr(r, a) for _, r in live], dtype=np.float32), ns)
                for a in ("freq", "pres", "rep")
            ]
            self._coo = tuple(to_device(torch.from_numpy(a), device) for a in (rows, cols, counts, *per))
        return self._coo


def _copy_row(r: RowTokens | None) -> RowTokens | None:
    if r is None:
        return None
    c = RowTokens.__new__(RowTokens)
    c.freq, c.pres, c.rep, c.n, c.n_prompt = r.freq, r.pres, r.rep, r.n, r.n_prompt
    c.index = dict(r.index)
    c.cols = r.cols.copy()
    c.counts = r.counts.copy()
    return c
