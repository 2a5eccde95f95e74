"""Pipeline step 3: penalties and token constraints (pure tensor functions).

Exact float32 semantics (the specification, mirrored by ``oracles/penalties.py``).
Every value below is float32; ``f``, ``p``, ``r`` are the request's
``frequency_penalty``, ``presence_penalty`` and ``repetition_penalty`` rounded once to
float32, and ``c`` is the token's count in the request's output (its initial
``output_ids`` included), converted to float32 (exact below 2**24).

1. additive (OpenAI/vLLM), only on tokens with ``c > 0``::

       x = (x - f * c) - p          # product rounded, then two subtractions

   Tokens absent from the output are left untouched (not ``x - 0``), and a ``-inf``
   logit (a mask from a processor) stays ``-inf``.
2. scaling (Hugging Face / vLLM ``repetition_penalty``), on tokens seen in the prompt
   or the output::

       x = x / r   if x > 0         # a true IEEE division, NOT x * (1 / r)
       x = x * r   otherwise        # a multiplication (-0.0 and -inf keep their sign)

   ``x * (1 / r)`` differs from ``x / r`` in the last bit for many ``r`` (e.g. 1.1);
   the division is the one specified.
3. min_new_tokens: ``x = -inf`` on the stop ids while the output is shorter than
   ``min_new_tokens``.
4. allowed_token_ids: every other token becomes ``-inf``.
5. bad_words: ``x = -inf`` on the last id of each banned sequence whose prefix (all but
   the last id) is the end of the output (single-id sequences are always banned).

Every function works on ``(row, col)`` index lists (COO) and touches only the listed
entries of the listed rows, one IEEE operation chain per element: the result of a row
depends on that row alone (bitwise batch-invariant), whatever the other rows or the
order of the entries. The dense variant computes the same bits (tested).
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def _penalize_values(
    v: torch.Tensor, counts: torch.Tensor, freq: torch.Tensor, pres: torch.Tensor, rep: torch.Tensor
) -> torch.Tensor:
    """The element rule (1 then 2 of the module docstring) on gathered values."""
    c = counts.to(torch.float32)
    add = (v - freq * c) - pres
    v = torch.where((counts > 0) & ~torch.isneginf(v), add, v)
    return torch.where(v > 0, v / rep, v * rep)


def _flat(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x viewed as 1-D, flat indices). Entries are read and written through 1-D
    ``index_select`` / ``index_copy_`` rather than 2-D advanced indexing: same bits,
    but no intra-op thread fan-out for a few thousand entries (which costs a
    scheduler quantum on a loaded machine; see docs/perf/penalties.md)."""
    if not x.is_contiguous():
        raise ValueError("x must be contiguous (a working copy owned by the caller)")
    return x.view(-1), rows * x.shape[1] + cols


def apply_penalties_coo_(x: torch.Tensor, coo: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Frequency, presence and repetition penalties on listed entries, in place.

    x: (B, V) float32, contiguous, a working copy owned by the caller.
    coo = ``(rows, cols, counts, freq, pres, rep)`` (``PenaltyState.coo``): rows, cols: (nnz,)
    int64, no duplicate ``(row, col)`` pair: every token seen in a
    penalised row's output (and, for rows with ``r != 1``, its prompt).
    counts: (nnz,) int32 output count of the token (0 = seen in the prompt only).
    freq, pres, rep: (nnz,) float32, the entry's row values.
    Returns ``x``. Bitwise equal to :func:`apply_penalties_dense_` on the same state.
    """
    rows, cols, counts, freq, pres, rep = coo
    if rows.numel() == 0:
        return x
    flat, idx = _flat(x, rows, cols)
    v = flat.index_select(0, idx)
    flat.index_copy_(0, idx, _penalize_values(v, counts, freq, pres, rep))
    return x


def apply_penalties_dense_(
    x: torch.Tensor, counts: torch.Tensor, seen: torch.Tensor, freq: torch.Tensor, pres: torch.Tensor, rep: torch.Tensor
) -> torch.Tensor:
    """Dense form of :func:`apply_penalties_coo_` (the vLLM layout), in place.

    x: (B, V) float32; counts: (B, V) int32 output counts; seen: (B, V) bool, token in
    prompt or output; freq, pres, rep: (B, 1) float32. Returns ``x``.
    """
    v = _penalize_values(x, counts, freq, pres, rep)
    x.copy_(torch.where(seen, v, x))
    return x


def ban_tokens_(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``x[rows[j], cols[j]] = -inf`` in place (duplicates allowed); returns ``x``.

    x: (B, V) float32, contiguous. Used for min_new_tokens (stop ids) and bad_words.
    rows, cols: (n,) int64.
    """
    if rows.numel():
        flat, idx = _flat(x, rows, cols)
        flat.index_fill_(0, idx, NEG_INF)
    return x


def restrict_to_allowed_(
    x: torch.Tensor, sel_rows: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor
) -> torch.Tensor:
    """Only ``(rows[j], cols[j])`` stay in the rows ``sel_rows``; the rest become -inf.

    x: (B, V) float32, contiguous, owned by the caller; sel_rows: (m,) int64 distinct
    rows having an allowed list; rows, cols: (n,) int64 the allowed entries of those
    rows (no duplicate pair). Values of allowed tokens are kept bit for bit. Returns x.
    """
    if sel_rows.numel() == 0:
        return x
    flat, idx = _flat(x, rows, cols)
    keep = flat.index_select(0, idx)
    x.index_fill_(0, sel_rows, NEG_INF)
    flat.index_copy_(0, idx, keep)
    return x
