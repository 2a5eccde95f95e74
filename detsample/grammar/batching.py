"""Hooks that connect grammars to SamplingBatch and Sampler (kept out of those files).

* :func:`build_row_grammars` -- one :class:`RequestGrammar` (or None) per new row,
  submitted for compilation when the batch is built.
* :func:`grammar_step` -- pipeline step 4 inside the Sampler: fill and apply the mask on
  rows with an active grammar; a row whose grammar failed (compile error or timeout) gets
  ``STATUS_NO_VALID_TOKEN | STATUS_GRAMMAR_ERROR`` so it yields token -1, while every
  other row samples normally; an unfinished row whose grammar is already terminated (a
  resumed request whose output ended it) gets ``STATUS_NO_VALID_TOKEN`` (token -1, and
  ``advance`` finishes it as ``"grammar_terminated"``).
* :func:`advance_grammars` -- inside ``batch.advance``: feed each matcher its token,
  finish terminated and failed rows, and raise (after every row was fed) when a
  matcher rejected a token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from detsample.errors import GrammarError, InvalidSamplingParams
from detsample.grammar.masker import GrammarMasker
from detsample.grammar.request import PENDING, RequestGrammar
from detsample.rules import STATUS_GRAMMAR_ERROR, STATUS_NO_VALID_TOKEN

#: ``batch.finished`` reasons set by grammars.
FINISH_GRAMMAR_TERMINATED = "grammar_terminated"
FINISH_GRAMMAR_ERROR = "grammar_error"
_NO_VALID_TOKEN = "no_valid_token"  # detsample.batch.FINISH_NO_VALID_TOKEN (batch imports us)


def build_row_grammars(requests: Sequence, vocab, think_end: int | None = None) -> list[RequestGrammar | None]:
    """A grammar per request (None for free rows); compilation starts in the pool.
    ``think_end``: the end-of-thinking token of ``require_reasoning`` requests."""
    out: list[RequestGrammar | None] = []
    for r in requests:
        g = r.params.grammar
        if g is not None and vocab is None:
            raise InvalidSamplingParams(
                f"request {r.rid!r}: {g[0]} needs a vocabulary; pass "
                "vocab=detsample.Vocabulary(...) to SamplingBatch.from_requests"
            )
        if g is not None and r.params.require_reasoning and think_end is None:
            raise InvalidSamplingParams(
                f"request {r.rid!r}: require_reasoning needs the end-of-thinking token; "
                "pass think_end_token_id to SamplingBatch.from_requests"
            )
        reasoning = think_end if r.params.require_reasoning else None
        out.append(
            RequestGrammar.from_params(r.rid, r.params, vocab, output_ids=r.output_ids, reasoning_end=reasoning)
            if g is not None
            else None
        )
    return out


def _live(batch) -> list[RequestGrammar | None]:
    """The grammars that mask this step: unfinished rows, not still reasoning."""
    return [
        g if g is not None and not g.dormant and batch.finished[i] is None else None
        for i, g in enumerate(batch.grammars)
    ]


def merged_vocab(batch, other):
    """The vocabulary of ``batch`` after ``batch.merge(other)``: grammar rows of both
    must share one vocabulary (checked before anything is merged)."""
    a, b = batch.vocab, other.vocab
    if a is None or b is None:
        return a if a is not None else b
    rows = batch.grammars + other.grammars
    if a.fingerprint != b.fingerprint and any(g is not None for g in rows):
        raise InvalidSamplingParams(f"merge: grammar rows need one vocabulary, got {a!r} and {b!r}")
    return a


def grammar_step(
    masker: GrammarMasker,
    batch,
    x: torch.Tensor,
    status: torch.Tensor,
    scratch: Callable[[], torch.Tensor] | None = None,
    row_max: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, tuple | None]:
    """Pipeline step 4: ``(x, status, maxima, allowed)`` after the grammar mask.

    ``x`` (B, V) float32 is never written: when a row has an active grammar a masked copy
    replaces it (the masker's persistent buffer on CPU, see
    :meth:`GrammarMasker.masked_step`; else ``scratch()`` when given, a reused (B, V)
    buffer that must not alias ``x``); otherwise ``x`` itself is returned. Rows without an
    active grammar keep their exact bits. Rows whose grammar failed get
    ``STATUS_NO_VALID_TOKEN | STATUS_GRAMMAR_ERROR``.

    ``row_max``: (B, 1) maxima of ``x`` when the caller knows them. ``maxima`` is then
    ``torch.amax`` of the returned logits (and a masked row left with no finite logit
    gets ``STATUS_NO_VALID_TOKEN`` here), so the caller need not reduce again; None when
    not known (the caller re-sanitises the changed logits, which flags such rows).

    ``allowed``: ``(columns, values)``, ``{row: allowed columns}`` (int64 numpy,
    ascending) of masked rows whose returned logits are ``-inf`` outside those columns
    and ``{row: the returned logits there}``, or None (:meth:`GrammarMasker.masked_step`);
    the sampler draws such rows over them alone.
    """
    grammars = batch.grammars
    if not any(g is not None for g in grammars):
        return x, status, row_max, None
    live = _live(batch)
    maxima, allowed = row_max, None
    if any(g is not None and (g.state == PENDING or g.is_active) for g in live):
        x, rows, maxima, allowed = masker.masked_step(x, live, row_max, scratch() if scratch is not None else None)
        if rows and maxima is not None:
            dead = torch.isneginf(maxima[:, 0])
            if bool(dead.any()):  # (status stays the same object when nothing changed)
                status = status | dead.to(status.dtype) * STATUS_NO_VALID_TOKEN
    failed = [i for i, g in enumerate(grammars) if g is not None and g.failed]
    # A live row whose grammar is already terminated (a resumed request whose existing
    # output ended the grammar) has nothing left to generate: token -1, never a free one.
    ended = [i for i, g in enumerate(live) if g is not None and g.is_terminated()]
    for rows, flags in ((failed, STATUS_NO_VALID_TOKEN | STATUS_GRAMMAR_ERROR), (ended, STATUS_NO_VALID_TOKEN)):
        if rows:
            status = status.clone()
            idx = torch.tensor(rows, dtype=torch.int64, device=status.device)
            status[idx] |= flags
    return x, status, maxima, allowed


def prefetch_grammars(masker: GrammarMasker, batch) -> int:
    """Start the next step's bitmask fill of the batch's live grammar rows in the
    background (call right after ``batch.advance``); returns how many rows."""
    return masker.prefetch(_live(batch))


def advance_grammars(batch, tokens: Sequence[int]) -> None:
    """Feed each active matcher its row's token (``-1`` tokens are skipped).

    A terminated grammar finishes its row (``FINISH_GRAMMAR_TERMINATED``); a failed one
    finishes it with ``FINISH_GRAMMAR_ERROR``. A token a matcher rejects fails that row
    and, once every row has been fed, raises :class:`GrammarError` naming the request
    and its accepted prefix (a rejected token is a bug: the mask forbade it).
    """
    errors = []
    for i, (g, t) in enumerate(zip(batch.grammars, tokens)):
        if g is None:
            continue
        if g.dormant:  # reasoning: the end-of-thinking token starts the grammar
            if t >= 0 and batch.finished[i] is None:
                g.see_reasoning_token(t)
            continue
        if g.state == PENDING:
            g.resolve()
        if g.is_active and t >= 0 and batch.finished[i] is None:
            # a finished row is no longer masked (grammar_step), so its tokens are not
            # the grammar's to judge: feeding them would fail the whole batch
            try:
                g.accept_token(t)
            except GrammarError as e:
                g.fail(str(e))
                errors.append(str(e))
        if g.failed:
            batch.finished[i] = FINISH_GRAMMAR_ERROR
        elif g.is_terminated() and batch.finished[i] in (None, _NO_VALID_TOKEN):
            # (no_valid_token here: the -1 of a row whose grammar had already ended)
            batch.finished[i] = FINISH_GRAMMAR_TERMINATED
    if errors:
        raise GrammarError("; ".join(errors))


def grammar_lengths(batch) -> list[int]:
    """Tokens each row's matcher holds (0 without a grammar); pending grammars are
    resolved first, as :func:`advance_grammars` does, so that the difference across an
    ``advance`` counts only the tokens that advance fed."""
    out = []
    for g in batch.grammars:
        if g is not None and g.state == PENDING and not g.dormant:
            g.resolve()
        out.append(g.progress if g is not None else 0)
    return out


def rollback_grammars(batch, counts: Sequence[int]) -> None:
    """Undo the last ``counts[i]`` tokens of row i's matcher (a terminated grammar
    becomes active again)."""
    for g, k in zip(batch.grammars, counts):
        if k:
            g.rollback(int(k))


def grammar_errors(batch) -> dict[str, str]:
    """``{request id: error message}`` of the rows whose grammar failed."""
    return {g.rid: g.error for g in batch.grammars if g is not None and g.failed}
