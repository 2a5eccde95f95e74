"""Pipeline step 7: temperature, applied to max-shifted logits."""

from __future__ import annotations

import torch

from detsample.ops import rowpass


def row_max(x: torch.Tensor) -> torch.Tensor:
    """x: (batch, vocab) float32 -> (batch, 1) float32 row maxima (exact, order-free)."""
    return torch.amax(x, dim=-1, keepdim=True)


def scale_logits(
    x: torch.Tensor, m: torch.Tensor, temperatures: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``z = (x - m) / T`` in float32: a subtraction then a true division (not a
    reciprocal multiply), so the row maximum maps to exactly 0 and ``exp(z) <= 1``.

    x: (batch, vocab) float32 with finite row maxima ``m``: (batch, 1) float32;
    temperatures: (batch, 1) float32, > 0. Shifting before dividing cannot overflow
    (``x - m <= 0``), whatever the magnitude of the logits or how small T is.
    Bitwise batch-invariant (element-wise IEEE operations).
    """
    fused = rowpass.scale(x, m, temperatures, out)  # one pass on a CPU, the same bits
    if fused is not None:
        return fused
    z = torch.sub(x, m, out=out) if out is not None else torch.sub(x, m)
    return z.div_(temperatures)
