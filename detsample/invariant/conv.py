"""Depthwise causal 1-D convolutions (short convolutions: LFM2; Mamba's ``conv1d``) as the
mode's row sums.

aten ``convolution(input (B, C, T), weight (C, 1, K), bias (C,) | None, stride [1],
padding [p], dilation [1], transposed False, output_padding, groups C) -> (B, C, T + 2p -
K + 1)``: each output element is ``sum_j weight[c, j] * x[b, c, t + j]`` over the input
padded by ``p`` zeros on each side, plus ``bias[c]``. torch's kernels (oneDNN, or the
native depthwise loop) choose their blocking by the call's shape, so an element's bits can
follow T and B. Here every output element is the same function of its own K-element
window: the K products (one IEEE multiplication each), the mode's invariant row sum
(:func:`~detsample.invariant.reduce.row_sum`: the verified serial sum, or the portable
fixed tree) over them in window order, then the bias added (one rounding). A decode step
that convolves the cached window with the new token (padding 0) and a prefill that
convolves the whole zero-padded sequence therefore give a position the same bits.

Reduced precision is computed in float32 and rounded once. Any other convolution
(grouped or dense channels, 2-D, strided, dilated, transposed) raises
:class:`~detsample.invariant.verify.NotInvariantError` naming it: the mode does not run it
silently on torch's kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from detsample.invariant.products import compute_dtype
from detsample.invariant.reduce import row_sum
from detsample.invariant.state import config
from detsample.invariant.verify import NotInvariantError

aten = torch.ops.aten


def _why_not(
    x: torch.Tensor, w: torch.Tensor, stride: Sequence[int], dilation: Sequence[int], transposed: bool, groups: int
) -> str:
    """Empty when the convolution is a depthwise 1-D one this kernel computes."""
    if x.dim() != 3 or w.dim() != 3:
        return f"{x.dim() - 2}-D"
    if transposed or list(stride) != [1] or list(dilation) != [1]:
        return "transposed, strided or dilated"
    if groups != x.shape[1] or w.shape[0] != x.shape[1] or w.shape[1] != 1:
        return f"not depthwise (groups {groups}, channels {x.shape[1]}, weight {tuple(w.shape)})"
    return ""


def _native(x: torch.Tensor, w: torch.Tensor) -> bool:
    return x.device.type != "cpu" or not x.dtype.is_floating_point or x.dtype != w.dtype


def depthwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding: int) -> torch.Tensor:
    """``x`` (B, C, T) convolved per channel with ``weight`` (C, 1, K), ``padding`` zeros
    each side: (B, C, T + 2 padding - K + 1), each element from its own window."""
    ct = compute_dtype(x.dtype)
    B, C, _ = x.shape
    K = weight.shape[-1]
    xs = x.to(ct)
    if padding:
        xs = aten.constant_pad_nd(xs, [padding, padding], 0.0)
    windows = xs.unfold(2, K, 1)  # (B, C, T', K), a view
    prods = windows * weight.to(ct).reshape(1, C, 1, K)  # one rounding each
    out = row_sum(prods.reshape(-1, K), config().portable).reshape(B, C, -1)
    if bias is not None:
        out = out + bias.to(ct).reshape(1, C, 1)
    return out.to(x.dtype)


def convolution(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> Any:
    """aten ``convolution`` under the mode: depthwise 1-D only (else a named error)."""
    why = _why_not(input, weight, stride, dilation, transposed, groups)
    if why or _native(input, weight):
        raise NotInvariantError(
            f"batch-invariant mode: the convolution of input {tuple(input.shape)} "
            f"{input.dtype} with weight {tuple(weight.shape)} {weight.dtype} is not covered "
            f"({why or 'a non-float, mixed-dtype or non-CPU call'}); the mode covers depthwise "
            f"1-D convolutions (docs/batch-invariant.md)"
        )
    return depthwise(input, weight, bias, int(padding[0]))
