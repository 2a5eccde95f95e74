"""Pipeline step 5: sparse logit bias."""

from __future__ import annotations

import torch


def apply_logit_bias_(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                      values: torch.Tensor) -> torch.Tensor:
    """``x[rows[j], cols[j]] += values[j]`` in place; returns ``x``.

    x: (batch, vocab) float32, a working copy owned by the caller.
    rows, cols: (nnz,) int64 with no duplicate (row, col) pair (so the scatter order
    cannot matter); values: (nnz,) float32. Bitwise batch-invariant: one float32 add per
    biased entry.
    """
    x.index_put_((rows, cols), values, accumulate=True)
    return x
