"""Fill and apply the grammar bitmask of a batch (pipeline step 4).

One :class:`GrammarMasker` (owned by a Sampler) keeps one bitmask buffer, grown when a
larger batch or vocabulary arrives, and an ``xgrammar.BatchGrammarMatcher`` that fills
the active rows in parallel. Only rows whose grammar is active are filled and masked;
every other row's logits are untouched, bit for bit.
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Sequence

import torch

from detsample.errors import GrammarError
from detsample.grammar.request import PENDING, RequestGrammar
from detsample.ops.mask import (allocate_token_bitmask, apply_token_bitmask_, bitmask_width,
                                masked_logits)


def resolve_all(grammars: Sequence[RequestGrammar | None]) -> None:
    """Wait for every pending grammar together, bounded by their timeout; a grammar not
    ready by then fails (its request only)."""
    pending = [g for g in grammars if g is not None and g.state == PENDING]
    if not pending:
        return
    cf.wait([g.future for g in pending], timeout=max(g.timeout_s for g in pending))
    for g in pending:
        g.resolve(timeout=0.0)


class GrammarMasker:
    """Reusable bitmask buffer + parallel fill + apply.

    Args:
        max_threads: threads xgrammar's batch matcher uses to fill rows ("auto" = half
            the hardware threads).
        parallel_min_rows: fill sequentially below this many active rows (thread hand-off
            costs more than it saves for one row).
    """

    def __init__(self, max_threads: int | str = "auto", parallel_min_rows: int = 2) -> None:
        self.max_threads = max_threads
        self.parallel_min_rows = parallel_min_rows
        self._bitmask: torch.Tensor | None = None
        self._batch_matcher = None

    def bitmask(self, batch: int, vocab_size: int) -> torch.Tensor:
        """The reused buffer, as a ``[batch, ceil(V/32)]`` view (contents stale)."""
        w = bitmask_width(vocab_size)
        bm = self._bitmask
        if bm is None or bm.shape[0] < batch or bm.shape[1] != w:
            bm = allocate_token_bitmask(max(batch, 1), vocab_size)
            self._bitmask = bm
        return bm[:batch]

    def fill(self, grammars: Sequence[RequestGrammar | None], vocab_size: int
             ) -> tuple[torch.Tensor, list[int]]:
        """Fill the bitmask rows of the active grammars; ``(bitmask, filled_rows)``.

        ``grammars[r]`` is row r's grammar or None. Pending grammars are waited for
        (bounded); failed/terminated ones are skipped.
        """
        resolve_all(grammars)
        bm = self.bitmask(len(grammars), vocab_size)
        rows = [r for r, g in enumerate(grammars) if g is not None and g.is_active]
        if not rows:
            return bm, rows
        if len(rows) < self.parallel_min_rows:
            for r in rows:
                grammars[r].fill_bitmask(bm, r)
        else:
            if self._batch_matcher is None:
                import xgrammar as xgr

                self._batch_matcher = xgr.BatchGrammarMatcher(self.max_threads)
            self._batch_matcher.batch_fill_next_token_bitmask(
                [grammars[r].matcher for r in rows], bm, rows)
        return bm, rows

    def _fill_for(self, logits: torch.Tensor, grammars: Sequence[RequestGrammar | None]
                  ) -> tuple[torch.Tensor | None, list[int], int]:
        sizes = {g.vocab.vocab_size for g in grammars if g is not None}
        if not sizes:
            return None, [], logits.shape[1]
        if len(sizes) > 1:
            raise GrammarError(f"grammars of one batch must share a vocabulary size, got "
                               f"{sorted(sizes)}")
        n = sizes.pop()
        if n > logits.shape[1]:
            raise GrammarError(f"grammar vocabulary has {n} tokens, more than the logits' "
                               f"{logits.shape[1]}")
        bm, rows = self.fill(grammars, n)
        return bm, rows, n

    def masked(self, logits: torch.Tensor, grammars: Sequence[RequestGrammar | None],
               out: torch.Tensor | None = None) -> tuple[torch.Tensor, list[int]]:
        """``(masked copy of logits, masked rows)``; ``logits`` itself when no row has an
        active grammar. The bitmask covers the grammars' vocabulary (n tokens); when the
        model's V is larger (an embedding padded past the tokenizer), ids n..V-1 are -inf
        on the masked rows. ``out``: optional result buffer (must not alias ``logits``)."""
        bm, rows, n = self._fill_for(logits, grammars)
        if not rows:
            return logits, rows
        return masked_logits(logits, bm, rows, limit=n, out=out), rows

    def apply_(self, logits: torch.Tensor, grammars: Sequence[RequestGrammar | None]
               ) -> list[int]:
        """In-place variant of :meth:`masked`; returns the masked rows."""
        bm, rows, n = self._fill_for(logits, grammars)
        if rows:
            apply_token_bitmask_(logits, bm, rows, limit=n)
        return rows
