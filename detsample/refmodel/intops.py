"""Exact integer kernels of the reference model (pure functions, no state).

Every function takes and returns int64 tensors holding fixed-point values (formats in
:mod:`detsample.refmodel.config`). Integer addition and multiplication are exact and
associative, so a result does not depend on how torch tiles, vectorises or threads a
matmul or a sum: **bitwise** the same for a row whatever else is in the tensor. The only
floating-point step, in :func:`rms_norm`, uses IEEE-754 correctly rounded operations
(division, square root, multiplication, round-half-even) on one element at a time, whose
results are a function of their operands alone.
"""

from __future__ import annotations

import math

import torch

from detsample.refmodel.config import ACT_FRAC, ACT_MAX, ATT_PROB_BITS, ATT_SHIFT, GAIN_FRAC, NORM_EPS

_MASKED_SCORE = -(2**61)


def round_shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``floor(x / 2**bits + 1/2)`` exactly (int64 in, int64 out, any shape)."""
    if bits == 0:
        return x
    return (x + (1 << (bits - 1))) >> bits


def clamp_act(x: torch.Tensor) -> torch.Tensor:
    """Clamp activations to ``[-ACT_MAX, ACT_MAX]`` (keeps every later sum far from 2**53)."""
    return x.clamp(-ACT_MAX, ACT_MAX)


def linear(x: torch.Tensor, w: torch.Tensor, shift: int) -> torch.Tensor:
    """``clamp(round_shift(x @ w, shift))``: x ``[..., K]`` int64, w ``[K, N]`` int64 -> ``[..., N]``.

    Exact: an int64 matmul has no rounding, so batching rows cannot change a row.
    """
    return clamp_act(round_shift(torch.matmul(x, w), shift))


def relu(x: torch.Tensor) -> torch.Tensor:
    """``max(x, 0)`` (exact)."""
    return x.clamp(min=0)


def rms_norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """RMSNorm over the last dim: x ``[..., D]`` int64, gain ``[D]`` int64 -> ``[..., D]`` int64.

    ``ss = sum(x**2)`` is an exact integer; the float64 steps (``ss / D + eps``, ``sqrt``,
    ``x / r``, ``* 2**ACT_FRAC``, ``round``) are each correctly rounded per element, so
    the output of a row depends on that row's integers only.
    """
    d = x.shape[-1]
    ss = (x * x).sum(dim=-1, keepdim=True)  # int64, exact
    r = torch.sqrt(ss.to(torch.float64) / d + NORM_EPS)  # float64, per row
    y = torch.round(x.to(torch.float64) / r * float(2**ACT_FRAC)).to(torch.int64)
    return clamp_act(round_shift(y * gain, GAIN_FRAC))


def exp_table(length: int, step: float) -> torch.Tensor:
    """``round(2**ATT_PROB_BITS * exp(-n * step))`` for n < length, last entry 0; int64 ``[length]``.

    Built once per model (and stored with its weights), never evaluated per token.
    """
    vals = [int(round(2.0**ATT_PROB_BITS * math.exp(-n * step))) for n in range(length - 1)]
    return torch.tensor(vals + [0], dtype=torch.int64)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, table: torch.Tensor
) -> torch.Tensor:
    """Integer softmax attention.

    q ``[B, H, Tq, Dh]``, k and v ``[B, H, Tk, Dh]``, mask ``[B, 1, Tq, Tk]`` bool (True =
    attend; every query row needs one True), table from :func:`exp_table`. Returns
    ``[B, H, Tq, Dh]`` int64 = ``round(sum_j w_j v_j / sum_j w_j)`` with
    ``w_j = table[(max_j s - s_j) >> ATT_SHIFT]`` and ``s = q . k``. Masked keys get weight 0
    exactly, so padding and the key count of a batch cannot change a row.
    """
    s = torch.matmul(q, k.transpose(-1, -2))
    s = torch.where(mask, s, _MASKED_SCORE)
    m = s.amax(dim=-1, keepdim=True)
    # a masked key's distance (m - s) >= 2**61 - 2**53 indexes past the table: its weight
    # is the table's last entry, exactly 0
    idx = ((m - s) >> ATT_SHIFT).clamp(max=table.shape[0] - 1)
    w = table[idx]
    z = w.sum(dim=-1, keepdim=True)
    num = torch.matmul(w, v)
    return torch.div(2 * num + z, 2 * z, rounding_mode="floor")
