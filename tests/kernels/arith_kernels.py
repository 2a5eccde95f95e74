"""Element-wise Triton kernels around detsample's arithmetic helpers of
detsample/kernels/common.py (exp64, exp32, log64, the two-word sum), for
tests/kernels/test_arith.py; imported only inside the interpreter worker."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from detsample.arith.spec import frac_bits
from detsample.kernels.common import OPTS, exp32, exp64, exp64_wide, fixed_value, fixed_words, fq_mass, log64

_B = 1024


#: the helper the element-wise kernel applies (its OP)
EXP64, EXP64_WIDE, EXP32, LOG64 = (tl.constexpr(i) for i in range(4))


@triton.jit
def _unary_kernel(x_ptr, out_ptr, N, OP: tl.constexpr, B: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * B + tl.arange(0, B)
    x = tl.load(x_ptr + i, mask=i < N, other=1.0)
    if OP == EXP64:
        y = exp64(x)
    elif OP == EXP64_WIDE:
        y = exp64_wide(x)
    elif OP == EXP32:
        y = exp32(x)
    else:
        y = log64(x)
    tl.store(out_ptr + i, y, mask=i < N)


@triton.jit
def _fixed_sum_kernel(e_ptr, h_ptr, q_ptr, hl_ptr, s_ptr, N, FRAC: tl.constexpr, B: tl.constexpr):
    """One row of N float32 ``e`` per program: each word pair, the mass, (H, L) and S."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, B)
    H = tl.zeros((B,), tl.int64)
    L = tl.zeros((B,), tl.int64)
    for start in range(0, N, B):
        idx = start + offs
        e = tl.load(e_ptr + row * N + idx, mask=idx < N, other=0.0)
        h, lo = fixed_words(e, FRAC)
        tl.store(h_ptr + (row * N + idx) * 2, h, mask=idx < N)
        tl.store(h_ptr + (row * N + idx) * 2 + 1, lo, mask=idx < N)
        tl.store(q_ptr + row * N + idx, fq_mass(e, FRAC), mask=idx < N)
        H += h
        L += lo
    tl.store(hl_ptr + row * 2, tl.sum(H, 0))
    tl.store(hl_ptr + row * 2 + 1, tl.sum(L, 0))
    tl.store(s_ptr + row, fixed_value(tl.sum(H, 0), tl.sum(L, 0), FRAC))


def _elementwise(op: tl.constexpr, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if x.numel():
        _unary_kernel[(triton.cdiv(x.numel(), _B),)](x, out, x.numel(), OP=op.value, B=_B, **OPTS)
    return out


def exp64_of(x: torch.Tensor) -> torch.Tensor:
    """float64 (N,) -> float32 (N,) by the ``exp64`` helper."""
    return _elementwise(EXP64, x, torch.float32)


def exp64_wide_of(x: torch.Tensor) -> torch.Tensor:
    """float64 (N,) -> float64 (N,): the ``exp64_wide`` helper (exp64 before rounding)."""
    return _elementwise(EXP64_WIDE, x, torch.float64)


def exp32_of(z: torch.Tensor) -> torch.Tensor:
    """float32 (N,) -> float32 (N,) by the ``exp32`` helper."""
    return _elementwise(EXP32, z, torch.float32)


def log64_of(x: torch.Tensor) -> torch.Tensor:
    """float64 (N,) -> float64 (N,) by the ``log64`` helper."""
    return _elementwise(LOG64, x, torch.float64)


def fixed_sum_of(e: torch.Tensor, frac: int | None = None):
    """e: (rows, n) float32 in [0, 1] -> ``(words (rows, n, 2) int64 (h, l), q (rows, n)
    int64 by fq_mass, HL (rows, 2) int64, S (rows,) float64)``; frac defaults to
    ``frac_bits(n)``."""
    e = e.contiguous()
    R, n = e.shape
    frac = frac_bits(n) if frac is None else frac
    words = torch.empty((R, n, 2), dtype=torch.int64, device=e.device)
    q = torch.empty((R, n), dtype=torch.int64, device=e.device)
    hl = torch.empty((R, 2), dtype=torch.int64, device=e.device)
    s = torch.empty((R,), dtype=torch.float64, device=e.device)
    _fixed_sum_kernel[(R,)](e, words, q, hl, s, n, FRAC=frac, B=256, **OPTS)
    return words, q, hl, s
