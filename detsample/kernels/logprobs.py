"""Pipeline step 10 in Triton: detsample's ``log_softmax`` and ``exp``
(:mod:`detsample.arith`'s definition, bit for bit).

:func:`log_softmax_rows` is :func:`detsample.arith.log_softmax` as a kernel, one program
per row, three passes over the row in blocks of
:func:`~detsample.kernels.common.row_block`:

1. ``m`` = the row max (exact: a maximum has no order); a row holding a NaN or a +inf,
   or no finite value, is "bad";
2. ``d = float64(x) - float64(m)`` (exact for any realistic row), ``e = exp64(d)``
   (:func:`~detsample.kernels.common.exp64`), each ``e`` split into its two fixed-point
   words of ``F = frac_bits(n)`` bits and summed as exact int64 (per lane in block
   order, then a tree: exact, so the order is irrelevant), ``S`` their float64 value,
   ``G = log64(S)`` (:func:`~detsample.kernels.common.log64`);
3. ``y = float32(d - G)`` (``-inf`` where ``x`` is ``-inf``); every entry of a bad row
   NaN32 (0x7fc00000).

:func:`normalisers_rows` stops after pass 2 and returns ``(m, G)``
(:func:`detsample.arith.normalisers`). :func:`exp` is :func:`detsample.arith.exp`.
Bitwise batch-invariant and run-to-run reproducible, and the same bits as
detsample.arith on the CPU (tests/kernels/test_arith.py) on any device that rounds
float64 ``+ - * /`` and conversions as IEEE and does not contract (``enable_fp_fusion``
off: :data:`~detsample.kernels.common.OPTS`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from detsample.arith.spec import frac_bits
from detsample.kernels.common import (
    OPTS,
    check_device,
    exp32,
    exp64,
    fixed_value,
    fixed_words,
    log64,
    nan32,
    nan64,
    row_block,
)


@triton.jit
def _exp_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + idx, mask=idx < N, other=0.0)
    tl.store(out_ptr + idx, exp32(x), mask=idx < N)


@triton.jit
def _log_softmax_kernel(
    x_ptr, out_ptr, m_ptr, g_ptr, stride_x, stride_o, N, FRAC: tl.constexpr, BLOCK: tl.constexpr, WRITE: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    xrow = x_ptr + row * stride_x
    offs = tl.arange(0, BLOCK)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    nan = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, N, BLOCK):  # 1: the max, and whether the row holds a NaN
        idx = start + offs
        x = tl.load(xrow + idx, mask=idx < N, other=float("-inf"))
        nan = nan | (x != x).to(tl.int32)
        m = tl.maximum(m, tl.where(x != x, float("-inf"), x))
    mx = tl.max(m, 0)
    has_nan = tl.max(nan, 0) != 0
    bad = has_nan | (mx == float("inf")) | (mx == float("-inf"))
    ms = tl.where(bad, 0.0, mx).to(tl.float64)
    H = tl.zeros((BLOCK,), tl.int64)
    L = tl.zeros((BLOCK,), tl.int64)
    for start in range(0, N, BLOCK):  # 2: the exact two-word sum of exp64(x - m)
        idx = start + offs
        x = tl.load(xrow + idx, mask=idx < N, other=float("-inf"))
        d = tl.where(bad, float("-inf"), x.to(tl.float64) - ms)  # a bad row sums 0
        h, lo = fixed_words(exp64(d), FRAC)
        H += h
        L += lo
    G = log64(fixed_value(tl.sum(H, 0), tl.sum(L, 0), FRAC))
    G = tl.where(bad, nan64(), G)
    if WRITE:
        for start in range(0, N, BLOCK):  # 3: float32(d - G)
            idx = start + offs
            x = tl.load(xrow + idx, mask=idx < N, other=0.0)
            y = ((x.to(tl.float64) - ms) - G).to(tl.float32)
            tl.store(out_ptr + row * stride_o + idx, tl.where(bad, nan32(), y), mask=idx < N)
    else:
        tl.store(m_ptr + row, tl.where(has_nan, nan32(), mx))
        tl.store(g_ptr + row, G)


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"x must be a (batch, vocab) float32 tensor, got {x.dtype} {tuple(x.shape)}")
    check_device(x.device)
    return x if x.stride(-1) == 1 else x.contiguous()


def log_softmax_rows(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`detsample.arith.log_softmax` of each row: x (batch, vocab) float32 ->
    (batch, vocab) float32 (into ``out`` when given: a (batch, vocab) float32 tensor with
    unit last stride, not ``x``). Bits: the definition's (within 1 ulp of the float64
    log_softmax; a row with a NaN, a +inf or no finite value is NaN32 everywhere),
    the same alone or in any batch."""
    x = _rows(x)
    R, N = x.shape
    if out is None:
        out = torch.empty((R, N), dtype=torch.float32, device=x.device)
    elif out.shape != x.shape or out.dtype != torch.float32 or out.stride(-1) != 1 or out.data_ptr() == x.data_ptr():
        raise ValueError("out must be a float32 tensor shaped like x with unit last stride, not x")
    if R and N:
        _log_softmax_kernel[(R,)](
            x, out, x, x, x.stride(0), out.stride(0), N, FRAC=frac_bits(N), BLOCK=row_block(N), WRITE=True, **OPTS
        )
    return out


def normalisers_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`detsample.arith.normalisers` of each row: x (batch, vocab) float32, vocab
    >= 1 -> ``(m, G)``, (batch,) float32 row maxima (NaN32 for a row holding a NaN) and
    (batch,) float64 ``G = log64(S)`` (NaN for a row whose log_softmax is all NaN32).
    ``detsample.arith.picked(x_i, m, G)`` is then the row's log_softmax at ``x_i``, bit
    for bit, for one pass over the row and no (batch, vocab) output."""
    x = _rows(x)
    R, N = x.shape
    if N == 0:
        raise ValueError("normalisers of rows of length 0")
    m = torch.empty((R,), dtype=torch.float32, device=x.device)
    G = torch.empty((R,), dtype=torch.float64, device=x.device)
    if R:
        _log_softmax_kernel[(R,)](
            x, x, m, G, x.stride(0), 0, N, FRAC=frac_bits(N), BLOCK=row_block(N), WRITE=False, **OPTS
        )
    return m, G


def exp(x: torch.Tensor) -> torch.Tensor:
    """:func:`detsample.arith.exp` element-wise: float32 ``x`` (any shape) -> float32
    ``exp64(float64(x))``, bit for bit arith's (the ``exp`` of the masses and the min-p
    test in :mod:`detsample.kernels.filters`, so a kept-set test agrees with the draw)."""
    if x.dtype != torch.float32:
        raise ValueError(f"x must be float32, got {x.dtype}")
    check_device(x.device)
    flat = x.contiguous().reshape(-1)
    out = torch.empty_like(flat)
    n = flat.numel()
    if n:
        blk = row_block(n)
        _exp_kernel[(triton.cdiv(n, blk),)](flat, out, n, BLOCK=blk, **OPTS)
    return out.reshape(x.shape)
