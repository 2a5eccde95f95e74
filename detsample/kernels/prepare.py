"""Pipeline steps 2 and 7 in Triton: non-finite sanitising with the row max, temperature.

Twins of :func:`detsample.ops.sanitize.sanitize_rows_flagged` and
:func:`detsample.ops.temperature.scale_logits` with the same contracts and the same bits
(both steps are exact: a maximum, value replacements, one IEEE subtraction and one
correctly rounded division per element). One program per row (sanitising) or per
(row, block) (scaling): bitwise batch-invariant.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from detsample import rules
from detsample.kernels.common import (
    NAN_FLOOR,
    OPTS,
    POSINF_CEIL,
    STATUS_HAD_NAN,
    STATUS_HAD_POSINF,
    STATUS_NO_VALID_TOKEN,
    check_device,
    row_block,
)


@triton.jit
def _clean(x):
    return tl.where(x != x, NAN_FLOOR, tl.where(x == float("inf"), POSINF_CEIL, x))


@triton.jit
def _row_stats_kernel(x_ptr, stride, V, m_ptr, status_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    nan = tl.zeros((BLOCK,), tl.int32)
    pinf = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, V, BLOCK):
        idx = start + offs
        x = tl.load(x_ptr + row * stride + idx, mask=idx < V, other=float("-inf"))
        m = tl.maximum(m, _clean(x))
        nan = nan | (x != x).to(tl.int32)
        pinf = pinf | (x == float("inf")).to(tl.int32)
    mx = tl.max(m, 0)
    status = (
        tl.max(nan, 0) * STATUS_HAD_NAN
        + tl.max(pinf, 0) * STATUS_HAD_POSINF
        + (mx == float("-inf")).to(tl.int32) * STATUS_NO_VALID_TOKEN
    )
    tl.store(m_ptr + row, mx)
    tl.store(status_ptr + row, status)


@triton.jit
def _sanitize_kernel(x_ptr, out_ptr, stride_x, stride_o, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    for start in range(0, V, BLOCK):
        idx = start + offs
        x = tl.load(x_ptr + row * stride_x + idx, mask=idx < V, other=0.0)
        tl.store(out_ptr + row * stride_o + idx, _clean(x), mask=idx < V)


@triton.jit
def _scale_kernel(x_ptr, m_ptr, t_ptr, out_ptr, stride_x, stride_o, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + idx, mask=idx < V, other=0.0)
    m = tl.load(m_ptr + row)
    t = tl.load(t_ptr + row)
    tl.store(out_ptr + row * stride_o + idx, tl.div_rn(x - m, t), mask=idx < V)


def _rows2d(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"x must be a (batch, vocab) float32 tensor, got {x.dtype} {tuple(x.shape)}")
    check_device(x.device)
    return x if x.stride(-1) == 1 else x.contiguous()


def sanitize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton twin of :func:`detsample.ops.sanitize.sanitize_rows_flagged` (same contract but
    its flag, same bits): x (batch, vocab) float32, not modified. Returns ``(clean, status,
    row_max)``
    with ``clean`` = ``x`` itself when no row has NaN or +inf, else a sanitised copy;
    status (batch,) int32 bit flags; row_max (batch, 1) float32."""
    x = _rows2d(x)
    B, V = x.shape
    m = torch.empty((B,), dtype=torch.float32, device=x.device)
    status = torch.empty((B,), dtype=torch.int32, device=x.device)
    if B == 0:
        return x, status, m.unsqueeze(1)
    blk = row_block(V)
    _row_stats_kernel[(B,)](x, x.stride(0), V, m, status, BLOCK=blk, **OPTS)
    if bool(((status & (rules.STATUS_HAD_NAN | rules.STATUS_HAD_POSINF)) != 0).any()):
        clean = torch.empty_like(x)
        _sanitize_kernel[(B,)](x, clean, x.stride(0), clean.stride(0), V, BLOCK=blk, **OPTS)
        x = clean
    return x, status, m.unsqueeze(1)


def scale_logits(
    x: torch.Tensor, m: torch.Tensor, temperatures: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Triton twin of :func:`detsample.ops.temperature.scale_logits`: ``z = (x - m) / T``
    with an IEEE subtraction and a correctly rounded division (``div_rn``), so the row
    maximum maps to exactly 0. x: (batch, vocab) float32; m, temperatures: (batch, 1)
    float32 (T > 0). Bit-identical to the torch op on any device (exact operations)."""
    x = _rows2d(x)
    B, V = x.shape
    if out is None:
        out = torch.empty_like(x)
    if B == 0:
        return out
    m = m.reshape(B).to(torch.float32).contiguous()
    t = temperatures.reshape(B).to(torch.float32).contiguous()
    blk = row_block(V)
    _scale_kernel[(B, triton.cdiv(V, blk))](x, m, t, out, x.stride(0), out.stride(0), V, BLOCK=blk, **OPTS)
    return out
