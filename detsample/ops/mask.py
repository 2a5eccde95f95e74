"""Grammar token bitmasks (pipeline step 4): allocate and apply.

A bitmask is a ``[B, ceil(V/32)]`` int32 tensor; bit ``t % 32`` of word ``t // 32`` in
row ``r`` is 1 when token ``t`` is allowed for row ``r`` (xgrammar's layout). Applying it
sets disallowed logits to ``-inf`` -- never a large negative add -- so the result is
bitwise the input on allowed tokens and exactly ``-inf`` elsewhere.
"""

from __future__ import annotations

from typing import Sequence

import torch

_BITS = 32


def bitmask_width(vocab_size: int) -> int:
    """``ceil(vocab_size / 32)``: int32 words per row."""
    return (int(vocab_size) + _BITS - 1) // _BITS


def allocate_token_bitmask(batch: int, vocab_size: int, device: str | torch.device = "cpu"
                           ) -> torch.Tensor:
    """A ``[batch, ceil(vocab_size/32)]`` int32 bitmask filled with -1 (all allowed)."""
    if batch < 0 or vocab_size < 1:
        raise ValueError(f"batch must be >= 0 and vocab_size >= 1, got {batch}, {vocab_size}")
    return torch.full((batch, bitmask_width(vocab_size)), -1, dtype=torch.int32, device=device)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[R, W]`` int32 -> ``[R, vocab_size]`` bool (True = allowed)."""
    shifts = torch.arange(_BITS, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor,
                         rows: Sequence[int] | torch.Tensor | None = None) -> torch.Tensor:
    """Set ``logits[r, t] = -inf`` where bit t of ``bitmask[r]`` is 0, for r in ``rows``.

    Args:
        logits: ``[B, V]`` float tensor, modified in place (and returned).
        bitmask: ``[>=B, ceil(V/32)]`` int32; row r of the bitmask masks row r of logits.
        rows: the rows to mask (those with an active grammar); None = every row.
            Rows not listed are untouched, bit for bit.
    Guarantee: bitwise -- allowed entries keep their exact value, others are -inf.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [B, V], got shape {tuple(logits.shape)}")
    b, v = logits.shape
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.shape[1] != bitmask_width(v):
        raise ValueError(f"bitmask must be int32 [B, {bitmask_width(v)}], got "
                         f"{bitmask.dtype} {tuple(bitmask.shape)}")
    if rows is None:
        idx = torch.arange(b, device=logits.device)
    else:
        idx = torch.as_tensor(rows, dtype=torch.long, device=logits.device).reshape(-1)
    if idx.numel() == 0:
        return logits
    if int(idx.min()) < 0 or int(idx.max()) >= min(b, bitmask.shape[0]):
        raise ValueError(f"rows must be in [0, {min(b, bitmask.shape[0])}), got {idx.tolist()}")
    allowed = unpack_bitmask(bitmask.index_select(0, idx.to(bitmask.device)), v)
    sub = logits.index_select(0, idx)
    sub.masked_fill_(~allowed.to(logits.device), float("-inf"))
    logits.index_copy_(0, idx, sub)
    return logits
