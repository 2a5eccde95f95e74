"""Pipeline step 5: sparse logit bias."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from detsample.ops.host import host_tensor

BiasCOO = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def bias_coo(per_row: Sequence[Iterable[tuple[int, float]] | None], device: torch.device) -> BiasCOO | None:
    """The COO form of per-row sparse biases, built once per batch composition.

    per_row: one entry per row, ``None`` or ``((token_id, bias), ...)`` with distinct
    token ids (``SamplingParams.logit_bias``'s normalised form). Returns ``(rows, cols,
    values)`` as (nnz,) int64, int64, float32 tensors on ``device`` in row-major order
    (no duplicate (row, col) pair), or None when no row has a bias.
    """
    rows, cols, vals = [], [], []
    for i, bias in enumerate(per_row):
        for tid, b in bias or ():
            rows.append(i)
            cols.append(tid)
            vals.append(b)
    if not rows:
        return None
    return (
        host_tensor(rows, torch.int64, device),
        host_tensor(cols, torch.int64, device),
        host_tensor(vals, torch.float32, device),
    )


def apply_logit_bias_(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``x[rows[j], cols[j]] += values[j]`` in place; returns ``x``.

    x: (batch, vocab) float32, a working copy owned by the caller.
    rows, cols: (nnz,) int64 with no duplicate (row, col) pair (so the scatter order
    cannot matter); values: (nnz,) float32. Bitwise batch-invariant: one float32 add per
    biased entry.
    """
    x.index_put_((rows, cols), values, accumulate=True)
    return x
