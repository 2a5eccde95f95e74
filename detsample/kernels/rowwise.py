"""Row-wise reductions with a fixed order: softmax, sum, mean, RMSNorm, LayerNorm (the
batch-invariant mode's CUDA ops; its ``log_softmax`` is detsample.arith's,
:mod:`detsample.kernels.logprobs`).

Every kernel here runs ONE program per row and walks the row in blocks of
:func:`~detsample.kernels.common.row_block` (a function of the row length only),
accumulating per lane in block order and reducing the lanes once by a fixed tree. No
row is ever split across programs, and nothing depends on the number of rows: a row's
result is bitwise the same alone or in any batch (batch-invariant), and the same on
every run of one device. Inputs of any float dtype are computed in float32 (float64
inputs in float64) and written in the requested output dtype.

The functions take 2-D ``(rows, n)`` views; :mod:`detsample.kernels.invariant_ops` maps
the aten signatures (``dim``, ``keepdim``, ``normalized_shape``...) onto them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from detsample.kernels.common import OPTS, check_device, exp32, row_block


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, stride_x, stride_o, N, SAFE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    for start in range(0, N, BLOCK):
        idx = start + offs
        x = tl.load(x_ptr + row * stride_x + idx, mask=idx < N, other=float("-inf"))
        m = tl.maximum(m, x.to(tl.float32))
    mx = tl.max(m, 0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, N, BLOCK):
        idx = start + offs
        x = tl.load(x_ptr + row * stride_x + idx, mask=idx < N, other=float("-inf"))
        acc += tl.where(idx < N, exp32(x.to(tl.float32) - mx), 0.0)
    s = tl.sum(acc, 0)
    for start in range(0, N, BLOCK):
        idx = start + offs
        x = tl.load(x_ptr + row * stride_x + idx, mask=idx < N, other=0.0).to(tl.float32)
        y = tl.div_rn(exp32(x - mx), s)
        if SAFE:  # a row of only -inf: zeros, not NaN
            y = tl.where(mx == float("-inf"), 0.0, y)
        tl.store(out_ptr + row * stride_o + idx, y.to(out_ptr.dtype.element_ty), mask=idx < N)


@triton.jit
def _row_total(x_ptr, row, stride_x, N, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """Sum of one row in ``ACC``: lane-wise in block order, then one fixed tree."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), ACC)
    for start in range(0, N, BLOCK):
        idx = start + offs
        acc += tl.load(x_ptr + row * stride_x + idx, mask=idx < N, other=0.0).to(ACC)
    return tl.sum(acc, 0)


@triton.jit
def _sum_kernel(x_ptr, out_ptr, stride_x, N, MEAN: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    total = _row_total(x_ptr, row, stride_x, N, ACC, BLOCK)
    if MEAN:
        total = total / N
    tl.store(out_ptr + row, total.to(out_ptr.dtype.element_ty))


@triton.jit
def _layer_norm_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    mean_ptr,
    rstd_ptr,
    stride_x,
    stride_o,
    N,
    eps,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mean = _row_total(x_ptr, row, stride_x, N, ACC, BLOCK) / N
    acc = tl.zeros((BLOCK,), ACC)
    for start in range(0, N, BLOCK):
        idx = start + offs
        d = tl.load(x_ptr + row * stride_x + idx, mask=idx < N, other=0.0).to(ACC) - mean
        acc += tl.where(idx < N, d * d, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(acc, 0) / N + eps)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    for start in range(0, N, BLOCK):
        idx = start + offs
        y = (tl.load(x_ptr + row * stride_x + idx, mask=idx < N, other=0.0).to(ACC) - mean) * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + idx, mask=idx < N, other=0.0).to(ACC)
        if HAS_B:
            y = y + tl.load(b_ptr + idx, mask=idx < N, other=0.0).to(ACC)
        tl.store(out_ptr + row * stride_o + idx, y.to(out_ptr.dtype.element_ty), mask=idx < N)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    rstd_ptr,
    stride_x,
    stride_o,
    N,
    eps,
    HAS_W: tl.constexpr,
    ACC: tl.constexpr,
    F64: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), ACC)
    for start in range(0, N, BLOCK):
        idx = start + offs
        x = tl.load(x_ptr + row * stride_x + idx, mask=idx < N, other=0.0).to(ACC)
        acc += x * x
    ms = tl.sum(acc, 0) / N + eps
    if F64:
        inv = 1.0 / tl.sqrt(ms)
    else:
        inv = tl.div_rn(1.0, tl.sqrt_rn(ms))
    tl.store(rstd_ptr + row, inv)
    for start in range(0, N, BLOCK):
        idx = start + offs
        x = tl.load(x_ptr + row * stride_x + idx, mask=idx < N, other=0.0).to(ACC)
        y = x * inv
        if HAS_W:
            y = y * tl.load(w_ptr + idx, mask=idx < N, other=0.0).to(ACC)
        tl.store(out_ptr + row * stride_o + idx, y.to(out_ptr.dtype.element_ty), mask=idx < N)


def _acc_dtype(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _rows(x: torch.Tensor, name: str = "x") -> torch.Tensor:
    if x.dim() != 2 or not x.dtype.is_floating_point:
        raise ValueError(f"{name} must be a 2-D floating tensor, got {x.dtype} {tuple(x.shape)}")
    check_device(x.device)
    return x if x.stride(-1) == 1 else x.contiguous()


def softmax_rows(x: torch.Tensor, out_dtype: torch.dtype | None = None, safe: bool = False) -> torch.Tensor:
    """softmax of each row of ``x`` (rows, n) -> (rows, n) in ``out_dtype`` (default:
    x's dtype), computed in float32. Three passes per row: the max, ``s = sum e_i`` with
    ``e_i = exp(x_i - max)`` (the float32 difference, then detsample's exp:
    :func:`~detsample.kernels.common.exp32`, not the GPU's ``ex2.approx``) accumulated per
    lane in block order and reduced by one fixed tree, then ``div_rn(e_i, s)``. ``safe``:
    a row of only ``-inf`` gives zeros (aten ``_safe_softmax``). Bitwise batch-invariant
    (one program per row, fixed block order), and every operation IEEE, so the bits do
    not depend on the GPU's transcendental units. (The sampler's ``log_softmax`` is
    :func:`detsample.kernels.logprobs.log_softmax_rows`, detsample.arith's definition.)"""
    x = _rows(x)
    R, N = x.shape
    out = torch.empty((R, N), dtype=out_dtype or x.dtype, device=x.device)
    if R and N:
        _softmax_kernel[(R,)](x, out, x.stride(0), out.stride(0), N, SAFE=bool(safe), BLOCK=row_block(N), **OPTS)
    return out


def sum_rows(x: torch.Tensor, out_dtype: torch.dtype | None = None, mean: bool = False) -> torch.Tensor:
    """Sum (``mean``: the mean) of each row of ``x`` (rows, n) -> (rows,), accumulated in
    float32 (float64 for float64 input) lane-wise in block order, then one fixed tree;
    written in ``out_dtype`` (default: x's dtype). Bitwise batch-invariant."""
    x = _rows(x)
    R, N = x.shape
    out = torch.empty((R,), dtype=out_dtype or x.dtype, device=x.device)
    if R:
        _sum_kernel[(R,)](x, out, x.stride(0), N, MEAN=bool(mean), ACC=_acc_dtype(x.dtype), BLOCK=row_block(N), **OPTS)
    return out


def mean_rows(x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Mean of each row of ``x`` (rows, n) -> (rows,): :func:`sum_rows` divided by n."""
    return sum_rows(x, out_dtype, mean=True)


def layer_norm_rows(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm of each row of ``x`` (rows, n): two-pass mean and variance in float32
    (float64 for float64 input), ``(x - mean) * rstd [* weight] [+ bias]``. Returns
    ``(out (rows, n) in x's dtype, mean (rows,), rstd (rows,))`` in the compute dtype.
    Bitwise batch-invariant."""
    x = _rows(x)
    R, N = x.shape
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = torch.empty_like(x)
    mean = torch.empty((R,), dtype=ct, device=x.device)
    rstd = torch.empty((R,), dtype=ct, device=x.device)
    w = x if weight is None else weight.reshape(-1).contiguous()
    b = x if bias is None else bias.reshape(-1).contiguous()
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.numel() != N:
            raise ValueError(f"{name} must have {N} elements, got {tuple(t.shape)}")
    if R and N:
        _layer_norm_kernel[(R,)](
            x,
            w,
            b,
            out,
            mean,
            rstd,
            x.stride(0),
            out.stride(0),
            N,
            float(eps),
            HAS_W=weight is not None,
            HAS_B=bias is not None,
            ACC=_acc_dtype(x.dtype),
            BLOCK=row_block(N),
            **OPTS,
        )
    return out, mean, rstd


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x * 1/sqrt(mean(x**2) + eps) [* weight]`` per row of ``x`` (rows, n); weight:
    (n,) or None. Computed in float32 (float64 for float64 input). Returns ``(out
    (rows, n) in x's dtype, rstd (rows,) = 1/sqrt(mean(x**2) + eps) in the compute
    dtype)``. Bitwise batch-invariant."""
    x = _rows(x)
    R, N = x.shape
    out = torch.empty_like(x)
    rstd = torch.empty((R,), dtype=torch.float64 if x.dtype == torch.float64 else torch.float32, device=x.device)
    w = x if weight is None else weight.reshape(-1).contiguous()
    if weight is not None and w.numel() != N:
        raise ValueError(f"weight must have {N} elements, got {tuple(weight.shape)}")
    if R and N:
        _rms_norm_kernel[(R,)](
            x,
            w,
            out,
            rstd,
            x.stride(0),
            out.stride(0),
            N,
            float(eps),
            HAS_W=weight is not None,
            ACC=_acc_dtype(x.dtype),
            F64=x.dtype == torch.float64,
            BLOCK=row_block(N),
            **OPTS,
        )
    return out, rstd
