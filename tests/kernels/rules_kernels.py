"""Element-wise Triton kernels around the rule helpers of detsample/kernels/common.py
(imported only inside the interpreter worker, where triton runs interpreted)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from detsample.kernels.common import (
    OPTS,
    PAD_ID,
    draw_target,
    element_keeps,
    first_above,
    fq_mass,
    min_p_keeps,
    top_p_keeps,
    top_p_limit,
    uniform,
)

_B = 16  # a block wider than every table


@triton.jit
def _mass_kernel(e_ptr, out_ptr, N, FRAC: tl.constexpr, B: tl.constexpr):
    i = tl.arange(0, B)
    e = tl.load(e_ptr + i, mask=i < N, other=0.0)
    tl.store(out_ptr + i, fq_mass(e, FRAC), mask=i < N)


@triton.jit
def _top_p_kernel(a_ptr, p_ptr, t_ptr, out_ptr, N, B: tl.constexpr):
    i = tl.arange(0, B)
    a = tl.load(a_ptr + i, mask=i < N, other=0)
    p = tl.load(p_ptr + i, mask=i < N, other=1.0)
    t = tl.load(t_ptr + i, mask=i < N, other=1)
    tl.store(out_ptr + i, top_p_keeps(a, top_p_limit(p, t)).to(tl.int32), mask=i < N)


@triton.jit
def _min_p_kernel(e_ptr, m_ptr, out_ptr, N, B: tl.constexpr):
    i = tl.arange(0, B)
    e = tl.load(e_ptr + i, mask=i < N, other=0.0)
    m = tl.load(m_ptr + i, mask=i < N, other=0.0)
    tl.store(out_ptr + i, min_p_keeps(e, m).to(tl.int32), mask=i < N)


@triton.jit
def _element_kernel(e_ptr, p_ptr, F, out_ptr, N):
    i = tl.program_id(0)  # one element a program, its (F,) parameters at p_ptr + i * F
    e = tl.load(e_ptr + i)
    tl.store(out_ptr + i, element_keeps(e, p_ptr + i * F).to(tl.int32))


@triton.jit
def _draw_kernel(u_ptr, q_ptr, out_ptr, N, B: tl.constexpr):
    i = tl.arange(0, B)
    u = tl.load(u_ptr + i, mask=i < N, other=0.5)
    q = tl.load(q_ptr + i, mask=i < N, other=1)
    tl.store(out_ptr + i, draw_target(u, q), mask=i < N)


@triton.jit
def _first_above_kernel(c_ptr, t, K, out_ptr, B: tl.constexpr):
    i = tl.arange(0, B)
    c = tl.load(c_ptr + i, mask=i < K, other=PAD_ID)  # padding never counts (> t)
    tl.store(out_ptr, first_above(c, t))


@triton.jit
def _uniform_kernel(w0_ptr, w1_ptr, out_ptr, N, B: tl.constexpr):
    i = tl.arange(0, B)
    w0 = tl.load(w0_ptr + i, mask=i < N, other=0).to(tl.uint32)
    w1 = tl.load(w1_ptr + i, mask=i < N, other=0).to(tl.uint32)
    tl.store(out_ptr + i, uniform(w0, w1), mask=i < N)


def mass(e: torch.Tensor, frac: int) -> torch.Tensor:
    out = torch.empty(e.shape, dtype=torch.int64)
    _mass_kernel[(1,)](e, out, e.numel(), FRAC=frac, B=_B, **OPTS)
    return out


def top_p(above: torch.Tensor, p: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    out = torch.empty(above.shape, dtype=torch.int32)
    _top_p_kernel[(1,)](above, p, total, out, above.numel(), B=_B, **OPTS)
    return out.bool()


def min_p(e: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    out = torch.empty(e.shape, dtype=torch.int32)
    _min_p_kernel[(1,)](e, m, out, e.numel(), B=_B, **OPTS)
    return out.bool()


def element(e: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """e: (N,) float32, params: (N, F) float32 -> (N,) bool ``element_keeps``."""
    out = torch.empty(e.shape, dtype=torch.int32)
    params = params.contiguous()
    _element_kernel[(e.numel(),)](e, params, params.shape[1], out, e.numel(), **OPTS)
    return out.bool()


def draw(u: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    out = torch.empty(u.shape, dtype=torch.int64)
    _draw_kernel[(1,)](u, total, out, u.numel(), B=_B, **OPTS)
    return out


def first(csum: torch.Tensor, t: int) -> int:
    out = torch.empty(1, dtype=torch.int32)
    _first_above_kernel[(1,)](csum, t, csum.numel(), out, B=_B, **OPTS)
    return int(out)


def uniforms(w0: torch.Tensor, w1: torch.Tensor) -> torch.Tensor:
    out = torch.empty(w0.shape, dtype=torch.float64)
    _uniform_kernel[(1,)](w0, w1, out, w0.numel(), B=_B, **OPTS)
    return out
