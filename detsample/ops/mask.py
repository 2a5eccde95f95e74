"""Grammar token bitmasks (pipeline step 4): allocate, unpack and apply.

A bitmask is a ``[B, W]`` int32 tensor, ``W = ceil(V/32)``; bit ``t % 32`` of word
``t // 32`` in row ``r`` is 1 when token ``t`` is allowed for row ``r`` (xgrammar's
layout). Applying it sets disallowed logits to ``-inf`` -- never a large negative add --
so allowed entries keep their exact bits (``-0.0`` included) and the others are exactly
``-inf``. Only the listed rows are touched.

A bitmask may be narrower than the logits (a model whose embedding is padded past its
tokenizer): tokens beyond ``32 * W`` or beyond ``limit`` are disallowed on masked rows.

Guarantee: bitwise, row-local (a row's result never depends on the other rows).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
import torch

_BITS = 32
_NEG_INF = float("-inf")


def bitmask_width(vocab_size: int) -> int:
    """``ceil(vocab_size / 32)``: int32 words per row."""
    return (int(vocab_size) + _BITS - 1) // _BITS


def allocate_token_bitmask(batch: int, vocab_size: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """A ``[batch, ceil(vocab_size/32)]`` int32 bitmask filled with -1 (all allowed)."""
    if batch < 0 or vocab_size < 1:
        raise ValueError(f"batch must be >= 0 and vocab_size >= 1, got {batch}, {vocab_size}")
    return torch.full((batch, bitmask_width(vocab_size)), -1, dtype=torch.int32, device=device)


def _unpack_torch(bitmask: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(8, dtype=torch.uint8, device=bitmask.device)
    by = bitmask.contiguous().view(torch.uint8)  # little-endian: byte k = bits 8k..8k+7
    return ((by.unsqueeze(-1) >> shifts) & 1).reshape(bitmask.shape[0], -1).bool()


def _unpack_numpy(bitmask: torch.Tensor) -> torch.Tensor:
    bits = np.unpackbits(bitmask.contiguous().numpy().view(np.uint8), axis=-1, bitorder="little")
    return torch.from_numpy(bits).view(torch.bool)


def unpack_bitmask(
    bitmask: torch.Tensor, vocab_size: int, limit: int | None = None, impl: str = "auto"
) -> torch.Tensor:
    """``[R, W]`` int32 -> ``[R, vocab_size]`` bool (True = allowed).

    Tokens ``>= min(32*W, limit)`` are False. ``impl``: "torch" (any device), "numpy"
    (CPU; ``numpy.unpackbits``, ~50x faster on CPU, identical bits) or "auto" (numpy for
    CPU tensors on a little-endian host, else torch).
    """
    if impl == "auto":
        impl = "numpy" if bitmask.device.type == "cpu" and sys.byteorder == "little" else "torch"
    if impl not in ("torch", "numpy"):
        raise ValueError(f"impl must be 'auto', 'torch' or 'numpy', got {impl!r}")
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise ValueError(f"bitmask must be 2-D int32, got {bitmask.dtype} {tuple(bitmask.shape)}")
    bits = _unpack_numpy(bitmask) if impl == "numpy" else _unpack_torch(bitmask)
    n = bits.shape[1] if limit is None else min(bits.shape[1], int(limit))
    if n >= vocab_size:
        return bits[:, :vocab_size]
    out = torch.zeros((bits.shape[0], vocab_size), dtype=torch.bool, device=bits.device)
    out[:, :n] = bits[:, :n]
    return out


def pack_bitmask(keep: torch.Tensor) -> torch.Tensor:
    """``[R, V]`` bool -> ``[R, ceil(V/32)]`` int32, token v at bit ``v % 32`` of word
    ``v // 32`` (the layout :func:`unpack_bitmask` reads; padding bits 0)."""
    if keep.dtype != torch.bool or keep.dim() != 2:
        raise ValueError(f"keep must be 2-D bool, got {keep.dtype} {tuple(keep.shape)}")
    R, V = keep.shape
    W = bitmask_width(V)
    padded = torch.zeros((R, W * _BITS), dtype=torch.int64, device=keep.device)
    padded[:, :V] = keep.to(torch.int64)
    weights = torch.bitwise_left_shift(
        torch.ones(_BITS, dtype=torch.int64, device=keep.device), torch.arange(_BITS, device=keep.device)
    )
    packed = (padded.view(R, W, _BITS) * weights).sum(-1)  # exact: < 2**32
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


#: The word-sparse path runs when at most this fraction of the bitmask words is nonzero.
SPARSE_MAX_FRACTION = 0.03


def _sparse_ok(logits: torch.Tensor, bitmask: torch.Tensor, limit: int | None) -> bool:
    v = logits.shape[1]
    return (
        v % _BITS == 0 and bitmask.shape[1] == v // _BITS and logits.is_contiguous() and (limit is None or limit >= v)
    )


def _masked_sparse(logits: torch.Tensor, words: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """Every row masked, V a multiple of 32: start from all -inf and copy only the
    32-token blocks whose word is nonzero. Identical bits to the dense select; None
    when too many words are nonzero for this to pay."""
    b, v = logits.shape
    nonzero = words != 0
    if int(torch.count_nonzero(nonzero)) > SPARSE_MAX_FRACTION * words.numel():
        return None  # decided by a count: the index list is built only when it pays
    nz = nonzero.nonzero()
    out = torch.full_like(logits, _NEG_INF) if out is None else out.fill_(_NEG_INF)
    if nz.shape[0]:
        r, c = nz[:, 0].to(logits.device), nz[:, 1].to(logits.device)
        blocks = logits.view(b, v // _BITS, _BITS)[r, c]
        bits = unpack_bitmask(words[nz[:, 0], nz[:, 1]].unsqueeze(1), _BITS).to(logits.device)
        neg = torch.tensor(_NEG_INF, dtype=logits.dtype, device=logits.device)
        out.view(b, v // _BITS, _BITS)[r, c] = torch.where(bits, blocks, neg)
    return out


def _row_index(rows, b: int, nb: int, device) -> torch.Tensor | None:
    """None for "every row" (rows None or 0..b-1), else a checked int64 index."""
    if rows is None:
        if nb < b:
            raise ValueError(f"bitmask has {nb} rows for {b} logits rows")
        return None
    idx = torch.as_tensor(rows, dtype=torch.long).reshape(-1)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= min(b, nb)):
        raise ValueError(f"rows must be in [0, {min(b, nb)}), got {idx.tolist()}")
    if idx.numel() == b and idx.numel() <= nb and torch.equal(idx, torch.arange(b)):
        return None
    return idx.to(device)


def _check(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [B, V], got shape {tuple(logits.shape)}")
    w = bitmask_width(logits.shape[1])
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or not 1 <= bitmask.shape[1] <= w:
        raise ValueError(f"bitmask must be int32 [B, <= {w}], got {bitmask.dtype} {tuple(bitmask.shape)}")


def masked_logits(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: Sequence[int] | torch.Tensor | None = None,
    limit: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """A new tensor: ``logits`` with ``-inf`` on the disallowed tokens of ``rows``.

    Args:
        logits: ``[B, V]`` float tensor (not modified).
        bitmask: ``[>=B, W]`` int32 with ``W <= ceil(V/32)``; row r masks logits row r.
        rows: rows to mask (None = every row); other rows are copied bit for bit.
        limit: tokens ``>= limit`` are disallowed on masked rows (the grammar's vocabulary
            size when the logits are wider).
        out: optional ``[B, V]`` result buffer that must not alias ``logits`` (a reused
            buffer saves the page faults of a fresh tensor on every step).
    Returns: ``[B, V]``, same dtype/device. One pass when every row is masked (no
    separate clone).
    """
    _check(logits, bitmask)
    b, v = logits.shape
    idx = _row_index(rows, b, bitmask.shape[0], logits.device)
    neg = torch.tensor(_NEG_INF, dtype=logits.dtype, device=logits.device)
    bitmask = bitmask.to(logits.device)  # unpack where the logits live (small copy)
    if idx is None:
        if _sparse_ok(logits, bitmask, limit):
            sparse = _masked_sparse(logits, bitmask[:b], out)
            if sparse is not None:
                return sparse
        allowed = unpack_bitmask(bitmask[:b], v, limit).to(logits.device)
        if out is None:
            return torch.where(allowed, logits, neg)
        return torch.where(allowed, logits, neg, out=out)
    out = logits.clone() if out is None else out.copy_(logits)
    if idx.numel():
        allowed = unpack_bitmask(bitmask.index_select(0, idx.to(bitmask.device)), v, limit)
        out.index_copy_(0, idx, torch.where(allowed.to(logits.device), logits.index_select(0, idx), neg))
    return out


def apply_token_bitmask_(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: Sequence[int] | torch.Tensor | None = None,
    limit: int | None = None,
) -> torch.Tensor:
    """In place: ``logits[r, t] = -inf`` where token t is disallowed for r in ``rows``.

    Same arguments and guarantee as :func:`masked_logits`; returns ``logits``.
    """
    _check(logits, bitmask)
    idx = _row_index(rows, logits.shape[0], bitmask.shape[0], logits.device)
    if idx is not None and idx.numel() == 0:
        return logits
    sel = idx if idx is not None else slice(None)
    sub = masked_logits(
        logits[sel], bitmask[sel] if idx is None else bitmask.index_select(0, idx.to(bitmask.device)), None, limit
    )
    if idx is None:
        logits.copy_(sub)
    else:
        logits.index_copy_(0, idx, sub)
    return logits
