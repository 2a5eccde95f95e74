"""Shared pieces of the Triton kernels: block sizes, device checks, jit helpers.

The sampling rules' constants come from :mod:`detsample.rules`; the formulas a kernel
needs are spelled here once each as ``@triton.jit`` helpers (the Triton spelling of the
rule of the same name there), and tests/kernels/test_rules.py runs them on the table
that tests/test_rules.py runs the Python spellings on.

Block sizes are functions of the row length only (never of the batch size), and every
launch uses the same ``num_warps``, so the order of each in-row reduction is fixed by
the row length alone: a row gives the same bits in any batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from detsample import rules

#: elements per block of the row-streaming kernels (a reduction tree of this width)
ROW_BLOCK = 1024
#: warps of every row kernel (part of the reduction order: never tuned per batch)
NUM_WARPS = 4
#: launch options of the row kernels: fixed warps, and no FMA contraction (explicit, so
#: the bits do not follow Triton's default, which changes in Triton 3.10)
OPTS = {"num_warps": NUM_WARPS, "enable_fp_fusion": False}

NAN_FLOOR: tl.constexpr = tl.constexpr(rules.NAN_FLOOR)
POSINF_CEIL: tl.constexpr = tl.constexpr(rules.POSINF_CEIL)
#: larger than any token id (padding of id buffers)
PAD_ID: tl.constexpr = tl.constexpr(rules.PAD_ID)
STATUS_HAD_NAN: tl.constexpr = tl.constexpr(rules.STATUS_HAD_NAN)
STATUS_HAD_POSINF: tl.constexpr = tl.constexpr(rules.STATUS_HAD_POSINF)
STATUS_NO_VALID_TOKEN: tl.constexpr = tl.constexpr(rules.STATUS_NO_VALID_TOKEN)
U_SCALE: tl.constexpr = tl.constexpr(rules.U_SCALE)


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
    """:func:`detsample.rules.mass`: ``trunc(e * 2**FRAC)`` of float32 ``e`` in [0, 1]."""
    return (e * (2.0 ** FRAC)).to(tl.int64)


@triton.jit
def top_p_limit(top_p, total):
    """:func:`detsample.rules.top_p_limit`: ``top_p * float64(Z)``, ``+inf`` at top_p >= 1."""
    return tl.where(top_p >= 1.0, float("inf"), top_p * total.to(tl.float64))


@triton.jit
def top_p_keeps(above, limit):
    """:func:`detsample.rules.top_p_keeps`: ``float64(above) < limit``."""
    return above.to(tl.float64) < limit


@triton.jit
def min_p_keeps(e, min_p):
    """:func:`detsample.rules.min_p_keeps`: ``exp(z) >= min_p``."""
    return e >= min_p


#: the element-wise filters :func:`element_keeps` spells, in its column order: the names of
#: :data:`detsample.rules.ELEMENT_FILTERS` (tests/kernels/test_rules.py holds the two equal;
#: the kernels refuse a registry they do not spell)
ELEMENT_FILTERS = ("min_p",)


@triton.jit
def element_keeps(e, params):
    """:func:`detsample.rules.element_keeps` of one row: whether every element-wise filter
    keeps ``e = exp(z)``; ``params`` points at the row's (F,) float32 parameters, column j
    of filter j of :data:`ELEMENT_FILTERS` (a new filter: its test ANDed here, reading
    ``params + j``)."""
    return min_p_keeps(e, tl.load(params))


@triton.jit
def draw_target(u, total):
    """:func:`detsample.rules.draw_target`: ``min(floor(u * float64(Q)), Q - 1)``."""
    return tl.minimum(tl.floor(u * total.to(tl.float64)).to(tl.int64), total - 1)


@triton.jit
def first_above(csum, t):
    """:func:`detsample.rules.first_above`: the count of running masses ``<= t``."""
    return tl.sum((csum <= t).to(tl.int32), 0)


@triton.jit
def uniform(w0, w1):
    """:func:`detsample.rules.uniform` of :func:`detsample.rules.u52`: ``(n + 0.5) *
    2**-52`` of the 52 bits ``(w0 << 20) | (w1 >> 12)`` of two uint32 Philox words."""
    n = (w0.to(tl.uint64) << 20) | (w1.to(tl.uint64) >> 12)
    return (n.to(tl.float64) + 0.5) * U_SCALE


@triton.jit
def order_key(z):
    """Order-preserving uint32 key of non-NaN float32 values (-0.0 keyed as +0.0, so
    the two zeros tie, as they do under ``>=``)."""
    z = tl.where(z == 0.0, 0.0, z)
    b = z.to(tl.uint32, bitcast=True)
    return tl.where((b >> 31) == 1, ~b, b | 0x80000000)
