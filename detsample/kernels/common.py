"""Shared pieces of the Triton kernels: block sizes, device checks, jit helpers.

Block sizes are functions of the row length only (never of the batch size), and every
launch uses the same ``num_warps``, so the order of each in-row reduction is fixed by
the row length alone: a row gives the same bits in any batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: elements per block of the row-streaming kernels (a reduction tree of this width)
ROW_BLOCK = 1024
#: warps of every row kernel (part of the reduction order: never tuned per batch)
NUM_WARPS = 4
#: launch options of the row kernels: fixed warps, and no FMA contraction (explicit, so
#: the bits do not follow Triton's default, which changes in Triton 3.10)
OPTS = {"num_warps": NUM_WARPS, "enable_fp_fusion": False}

F32_MIN: tl.constexpr = tl.constexpr(-3.4028234663852886e38)
F32_MAX: tl.constexpr = tl.constexpr(3.4028234663852886e38)
#: larger than any token id (padding of id buffers)
ID_PAD: tl.constexpr = tl.constexpr(2**62)


def row_block(n: int) -> int:
    """Block width for rows of length ``n``: ``min(ROW_BLOCK, next_pow2(n))``."""
    return min(ROW_BLOCK, triton.next_power_of_2(max(int(n), 1)))


def interpreted() -> bool:
    """True when this process's kernels run under the Triton interpreter (they were
    decorated with ``TRITON_INTERPRET=1``); read from the decorated kernel's type, not
    from the environment."""
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(fq_mass, InterpretedFunction)


def check_device(device: torch.device) -> None:
    """Raise ValueError unless kernels can run on tensors of ``device``: CUDA (compiled)
    or CPU under the interpreter."""
    if device.type == "cuda":
        return
    if device.type == "cpu" and interpreted():
        return
    raise ValueError(
        f"Triton kernels need CUDA tensors, or CPU tensors under the Triton interpreter "
        f"(TRITON_INTERPRET=1 set before triton is imported); got device {device.type!r}")


@triton.jit
def fq_mass(e, FRAC: tl.constexpr):
    """Fixed-point mass ``trunc(e * 2**FRAC)`` of float32 ``e`` in [0, 1] (exact scaling)."""
    return (e * (2.0 ** FRAC)).to(tl.int64)


@triton.jit
def order_key(z):
    """Order-preserving uint32 key of non-NaN float32 values (-0.0 keyed as +0.0, so
    the two zeros tie, as they do under ``>=``)."""
    z = tl.where(z == 0.0, 0.0, z)
    b = z.to(tl.uint32, bitcast=True)
    return tl.where((b >> 31) == 1, ~b, b | 0x80000000)
