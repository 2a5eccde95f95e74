"""Pipeline step 3 as the Sampler runs it: penalties, then token constraints.

Order (part of the contract, docs/sampling.md step 3 and docs/sampling-penalties.md):

1. additive penalties (frequency, presence) and 2. scaling (repetition), one fused
   element rule (:func:`detsample.ops.penalties.apply_penalties_coo_`);
3. min_new_tokens: -inf on ``params.stop_token_ids`` + the row's EOS ids
   (``batch.row_eos[i]``: the ``eos_token_ids`` of the batch it was built in) while
   ``len(output_ids) < min_new_tokens``;
4. allowed_token_ids, then 5. bad_words.

Rows that use none of these are never touched, and a batch where no row uses any of
them costs one cached host check. The values are built from the batch's per-row host
state (``PenaltyState`` counts, ``output_ids``), so each row's result depends on that
row alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from detsample.ops import penalties as pen_ops
from detsample.ops.host import host_tensor
from detsample.processors.batch_update import BatchView


def min_tokens_stops(params, eos_token_ids) -> tuple[int, ...]:
    """The ids min_new_tokens blocks: ``params.stop_token_ids`` and the EOS ids, sorted."""
    return tuple(sorted(set(params.stop_token_ids) | set(eos_token_ids)))


@dataclass(frozen=True)
class ConstraintRows:
    """Which rows need which constraint (recomputed when the batch composition changes)."""

    min_tokens: tuple[tuple[int, int, tuple[int, ...]], ...]  # (row, min_new, stops)
    allowed: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # sel, rows, cols
    bad_words: tuple[tuple[int, tuple[tuple[int, ...], ...]], ...]  # (row, sequences)

    @property
    def empty(self) -> bool:
        return not self.min_tokens and self.allowed is None and not self.bad_words


def constraint_rows(batch: BatchView) -> ConstraintRows:
    mt, bw, sel, ar, ac = [], [], [], [], []
    for i, p in enumerate(batch.params):
        if p.min_new_tokens > 0:
            stops = min_tokens_stops(p, batch.row_eos[i])
            if stops:
                mt.append((i, p.min_new_tokens, stops))
        if p.allowed_token_ids is not None:
            sel.append(i)
            ar.extend([i] * len(p.allowed_token_ids))
            ac.extend(p.allowed_token_ids)
        if p.bad_words:
            bw.append((i, p.bad_words))
    allowed = None
    if sel:
        allowed = tuple(host_tensor(v, torch.int64, batch.device) for v in (sel, ar, ac))
    return ConstraintRows(tuple(mt), allowed, tuple(bw))


def banned_entries(batch: BatchView, rows: ConstraintRows) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """``(row, col)`` pairs set to -inf this step: min_new_tokens stops, bad words."""
    outs = batch.output_ids
    stops = [(i, t) for i, need, ids in rows.min_tokens if len(outs[i]) < need for t in ids]
    bad = []
    for i, seqs in rows.bad_words:
        out = outs[i]
        n = len(out)
        for seq in seqs:
            k = len(seq) - 1
            if k <= n and (k == 0 or out[n - k :] == list(seq[:-1])):
                bad.append((i, seq[-1]))
    return stops, bad


def ban_pairs_(x: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
    """``x[r, c] = -inf`` in place for each ``(r, c)`` of ``pairs`` (a host list)."""
    if pairs:
        rc = host_tensor(pairs, torch.int64, x.device)
        pen_ops.ban_tokens_(x, rc[:, 0], rc[:, 1])


def apply_penalties_and_constraints(
    x: torch.Tensor, batch: BatchView, scratch: Callable[[], torch.Tensor] | None = None
) -> torch.Tensor:
    """Apply step 3 to ``x`` (B, V) float32, never writing into ``x``.

    Returns ``x`` itself when no row needs anything this step, else a new tensor: a
    copy of ``x`` in ``scratch()`` (a reusable (B, V) float32 buffer, which spares the
    page faults of a fresh 39 MB tensor per step) or in a fresh tensor. The Sampler
    re-sanitises it: an extreme penalty can overflow a logit to +inf, and a constraint
    can leave a row without an admissible token.
    """
    state = batch.penalties
    coo = state.coo(batch.device) if state is not None else None
    rows = batch.constraint_rows()
    if coo is None and rows.empty:
        return x
    stops, bad = banned_entries(batch, rows)
    if coo is None and rows.allowed is None and not stops and not bad:
        return x
    x = scratch().copy_(x) if scratch is not None else x.clone()
    if coo is not None:
        pen_ops.apply_penalties_coo_(x, coo)
    ban_pairs_(x, stops)
    if rows.allowed is not None:
        pen_ops.restrict_to_allowed_(x, *rows.allowed)
    ban_pairs_(x, bad)
    return x
