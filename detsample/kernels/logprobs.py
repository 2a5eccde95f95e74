"""Pipeline step 10 in Triton: ``log_softmax`` with a fixed reduction order, and ``exp``.

``log_softmax`` is :func:`detsample.kernels.rowwise.softmax_rows`: one program per row,
three passes over the row in blocks of :func:`~detsample.kernels.common.row_block` (a
function of the vocabulary size only): the row max, then ``s = sum exp(x - max)``
accumulated per lane in block order and reduced once by a fixed tree, then
``(x - max) - log(s)``. No split of a row across
programs, nothing that depends on the batch: bitwise batch-invariant and run-to-run
reproducible on one device. Against torch the values agree only within the bound of
docs/gpu.md (``exp``/``log`` differ between libm, the interpreter's numpy and the GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from detsample.kernels.common import OPTS, check_device, row_block
from detsample.kernels.rowwise import softmax_rows


@triton.jit
def _exp_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + idx, mask=idx < N, other=0.0)
    tl.store(out_ptr + idx, tl.exp(x), mask=idx < N)


def log_softmax_rows(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: (batch, vocab) float32 -> (batch, vocab) float32 log_softmax (into ``out`` when
    given, a contiguous (batch, vocab) float32 tensor). Bitwise batch-invariant."""
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"x must be a (batch, vocab) float32 tensor, got {x.dtype} "
                         f"{tuple(x.shape)}")
    return softmax_rows(x, log=True, out=out)


def exp(x: torch.Tensor) -> torch.Tensor:
    """Element-wise float32 ``exp`` with the kernels' own ``tl.exp`` (the exp that the
    fixed-point masses use, so a kept-set test agrees with the draw on every device)."""
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
