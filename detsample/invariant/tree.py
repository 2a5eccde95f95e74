"""Portable reductions: a row sum whose order of additions is fixed by detsample.

The definition (``oracles/invariant.py`` spells the same): for a row ``x`` of ``N``
elements, let ``h`` be the largest power of two below ``N`` (``N >= 2``); element ``i < h``
becomes ``x[i] + x[i + h]`` when ``i + h < N``, else stays ``x[i]``; the row, now of
``h`` elements, is reduced the same way until one element is left. Every step is one
IEEE addition (correctly rounded on every ISA, vector or scalar), so the bits of a row's
sum depend on the row only: not on the other rows, the call, the thread count, the CPU.

``N == 0`` sums to 0. The mean is that sum divided by ``N`` (one IEEE division).
"""

from __future__ import annotations

import torch


def tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Row sums ``(R, N) -> (R,)`` of a floating tensor, in its dtype, by the fixed tree."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, n), got shape {tuple(x.shape)}")
    n = x.shape[1]
    if n == 0:
        return x.new_zeros((x.shape[0],))
    if n == 1:
        return x[:, 0].clone()
    h = 1 << ((n - 1).bit_length() - 1)  # largest power of two < n
    y = x[:, :h].clone()
    y[:, : n - h].add_(x[:, h:n])
    while h > 1:
        h //= 2
        y = y[:, :h] + y[:, h : 2 * h]
    return y[:, 0]
