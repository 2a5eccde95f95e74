"""A persistent matmul with fixed tiles and no split-K: ``mm``, ``addmm``, ``bmm``.

Each output tile of ``BLOCK_M x BLOCK_N`` is computed by one program that walks K from 0
in steps of ``BLOCK_K``, accumulating in float32 (``tl.dot``; float32 inputs in IEEE
precision, never TF32). The tile sizes depend on the dtype only, never on M, N or K;
there is no split-K and no reduction across programs, so output element ``(m, n)`` is a
fixed sequence of operations on row ``m`` of A and column ``n`` of B whatever the number
of rows: bitwise batch-invariant (a row gives the same bits alone or inside any M).
"Persistent": a grid of at most ``programs`` programs (the device's SM count on CUDA)
strides over the tiles; which program computes a tile never changes its bits.

Signatures mirror aten: ``mm(a, b)``, ``addmm(bias, a, b, beta=1, alpha=1)``,
``bmm(a, b)``, ``baddbmm(bias, a, b, beta=1, alpha=1)``; output dtype = input
dtype. Inputs: float32, bfloat16, float16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from detsample.kernels.common import check_device

#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps) per input dtype: fixed, part of the bits
TILES = {
    torch.float32: (32, 64, 32, 4),
    torch.bfloat16: (64, 128, 64, 4),
    torch.float16: (64, 128, 64, 4),
}
#: programs of the persistent grid when the device does not say (the interpreter)
DEFAULT_PROGRAMS = 4


@triton.jit
def _matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    BATCH,
    PROGRAMS,
    s_ab,
    s_am,
    s_ak,
    s_bb,
    s_bk,
    s_bn,
    s_cb,
    s_cm,
    s_cn,
    s_xb,
    s_xm,
    s_xn,
    alpha,
    beta,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_batch = tiles_m * tiles_n
    for tile in range(pid, per_batch * BATCH, PROGRAMS):
        bi = (tile // per_batch).to(tl.int64)
        t = tile % per_batch
        rm = (t // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (t % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(
                a_ptr + bi * s_ab + rm[:, None] * s_am + rk[None, :] * s_ak,
                mask=(rm[:, None] < M) & (rk[None, :] < K),
                other=0.0,
            )
            b = tl.load(
                b_ptr + bi * s_bb + rk[:, None] * s_bk + rn[None, :] * s_bn,
                mask=(rk[:, None] < K) & (rn[None, :] < N),
                other=0.0,
            )
            if IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        if HAS_BIAS:
            x = tl.load(bias_ptr + bi * s_xb + rm[:, None] * s_xm + rn[None, :] * s_xn, mask=mask, other=0.0).to(
                tl.float32
            )
            acc = acc * alpha + x * beta
        else:
            acc = acc * alpha  # exact when alpha == 1
        tl.store(c_ptr + bi * s_cb + rm[:, None] * s_cm + rn[None, :] * s_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)


def _programs(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_PROGRAMS


def _launch(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, alpha: float, beta: float) -> torch.Tensor:
    """a: (batch, M, K), b: (batch, K, N), bias broadcastable to (batch, M, N) or None."""
    if a.dtype not in TILES or b.dtype != a.dtype:
        raise ValueError(f"matmul inputs must share a dtype in {sorted(map(str, TILES))}, got {a.dtype} and {b.dtype}")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"matmul shapes do not match: {tuple(a.shape)} @ {tuple(b.shape)}")
    check_device(a.device)
    batch, M, K = a.shape
    N = b.shape[2]
    c = torch.empty((batch, M, N), dtype=a.dtype, device=a.device)
    if c.numel() == 0:
        return c
    if K == 0:
        return c.zero_() if bias is None else (c.zero_() + beta * bias).to(a.dtype)
    bm, bn, bk, warps = TILES[a.dtype]
    if bias is not None:
        bias = bias.expand(batch, M, N)
    x = bias if bias is not None else c
    tiles = batch * triton.cdiv(M, bm) * triton.cdiv(N, bn)
    programs = min(tiles, _programs(a.device))
    _matmul_kernel[(programs,)](
        a,
        b,
        c,
        x,
        M,
        N,
        K,
        batch,
        programs,
        a.stride(0),
        a.stride(1),
        a.stride(2),
        b.stride(0),
        b.stride(1),
        b.stride(2),
        c.stride(0),
        c.stride(1),
        c.stride(2),
        x.stride(0),
        x.stride(1),
        x.stride(2),
        float(alpha),
        float(beta),
        HAS_BIAS=bias is not None,
        IEEE=a.dtype == torch.float32,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        num_warps=warps,
        enable_fp_fusion=False,
    )
    return c


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """aten ``mm``: a (M, K) @ b (K, N) -> (M, N) in a's dtype. Bitwise batch-invariant
    in M (fixed tiles, no split-K)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"mm needs (M, K) @ (K, N), got {tuple(a.shape)} @ {tuple(b.shape)}")
    return _launch(a.unsqueeze(0), b.unsqueeze(0), None, 1.0, 0.0)[0]


def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1, alpha: float = 1) -> torch.Tensor:
    """aten ``addmm``: ``beta * bias + alpha * (a @ b)``; bias broadcastable to (M, N)
    (ignored, NaN included, when beta == 0, as aten does). Bitwise batch-invariant."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"addmm needs mat1 (M, K) @ mat2 (K, N), got {tuple(a.shape)} @ {tuple(b.shape)}")
    M, N = a.shape[0], b.shape[1]
    x = None if beta == 0 else bias.expand(M, N).unsqueeze(0)
    return _launch(a.unsqueeze(0), b.unsqueeze(0), x, alpha, beta)[0]


def baddbmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1, alpha: float = 1) -> torch.Tensor:
    """aten ``baddbmm``: ``beta * bias + alpha * bmm(a, b)``; bias broadcastable to
    (batch, M, N) (not read when beta == 0). Bitwise batch-invariant."""
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"baddbmm needs (batch, M, K) @ (batch, K, N), got {tuple(a.shape)} @ {tuple(b.shape)}")
    x = None if beta == 0 else bias.expand(a.shape[0], a.shape[1], b.shape[2])
    return _launch(a, b, x, alpha, beta)


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """aten ``bmm``: a (batch, M, K) @ b (batch, K, N) -> (batch, M, N). Each (batch
    entry, row) is bitwise independent of the others."""
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"bmm needs (batch, M, K) @ (batch, K, N), got {tuple(a.shape)} @ {tuple(b.shape)}")
    return _launch(a, b, None, 1.0, 0.0)
