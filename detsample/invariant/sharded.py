"""The portable product split across tensor-parallel ranks, and the exact collectives around it.

A row-parallel layer (``o_proj``, ``down_proj`` in the Megatron layout) holds a K-range of
the weight on each rank and sees the matching K-range of the activations. The portable
product (:mod:`detsample.invariant.fixedpoint`) is order-free in K, so the split keeps
the bits of the single product when every rank uses the **global** scales and the
partial integer sums are added exactly:

1. each rank :func:`~detsample.invariant.fixedpoint.scan` s its slice: the maximum
   magnitude ``top`` of each row of A (and of each column of B) over its K-range, and
   where a non-finite value sat (``bad``);
2. ``top`` is all-reduced with MAX (exact: a maximum does not round, and does not
   depend on the order of the ranks; a slice with a non-finite value sends +inf), so every
   rank quantises with the exponent the single product takes
   (:func:`~detsample.invariant.fixedpoint.quantize`) and knows the non-finite slices;
3. each rank's partial sum ``S_r`` is an exact integer (:func:`~detsample.invariant.fixedpoint.exact_int`);
   the ``S_r`` are all-reduced with an int64 SUM (exact, order-free), giving the ``S`` of
   the single product;
4. :func:`~detsample.invariant.fixedpoint.combine`, once, on every rank: the bits of TP=1.

The collectives come in a :class:`Reduce` (``detsample.parallel`` gives one over a
``torch.distributed`` process group); nothing here imports ``torch.distributed``.

:func:`owner_rows` (the vocab-parallel embedding) and :func:`concat_last` (the
vocab-parallel head) are exact as well: a row is taken from the one rank that owns it
(an integer sum of its bit pattern with zeros) and the shards are concatenated.

The functions of :data:`UNITS` are single units for the coverage check
(:mod:`detsample.invariant.coverage`): the ops they run inside (frexp, integer products,
collectives) are this module's arithmetic, tested as such (tests/parallel/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from detsample.invariant import fixedpoint
from detsample.invariant.fixedpoint import A_BITS, B_BITS, Fixed


@dataclass(frozen=True)
class Reduce:
    """The collectives of a group of ranks, each in place on a tensor every rank holds
    with the same shape: ``max_`` (element-wise maximum over the ranks), ``sum_`` (an
    element-wise sum of int64 tensors) and ``gather`` (the ranks' tensors, rank order)."""

    max_: Callable[[torch.Tensor], None]
    sum_: Callable[[torch.Tensor], None]
    gather: Callable[[torch.Tensor], list[torch.Tensor]]


def _global(x: torch.Tensor, dim: int, bits: int, reduce: Reduce) -> Fixed:
    """``x``'s slice in fixed point at the scales of the whole (K split over the ranks).
    One MAX carries both the maxima and the non-finite flags: a slice that held a
    non-finite value on any rank sends +inf, and its scale is then irrelevant (every
    output element of that row / column is NaN, as at TP=1)."""
    xd, top, bad = fixedpoint.scan(x, dim)
    top = top.contiguous() if bad is None else torch.where(bad, float("inf"), top)
    reduce.max_(top)
    flags = torch.isinf(top)
    bad = flags if bool(flags.any()) else None
    if bad is not None:
        top = torch.where(bad, 1.0, top)
    return fixedpoint.quantize(xd, top, bad, dim, bits, owned=xd is not x)


def split_k_fixed_b(b: torch.Tensor, reduce: Reduce) -> Fixed:
    """This rank's rows ``(K_r, N)`` of a B operand split over K, in fixed point with the
    column scales of the whole B (a collective: every rank calls it)."""
    return _global(b, -2, B_BITS, reduce)


def split_k_matmul(a: torch.Tensor, fb: Fixed, reduce: Reduce) -> torch.Tensor:
    """The portable ``A @ B`` for K split over the ranks: ``a (M, K_r)`` this rank's
    columns of A, ``fb`` its rows of B from :func:`split_k_fixed_b`. Returns ``(M, N)``
    float32 on every rank, bitwise :func:`detsample.invariant.fixedpoint.matmul` of the
    whole operands (a collective: every rank calls it)."""
    fa = _global(a, -1, A_BITS, reduce)
    s = fixedpoint.exact_int(fa, fb).contiguous()
    reduce.sum_(s)
    return fixedpoint.combine(s, fa, fb, torch.float32)


def _bit_dtype(dtype: torch.dtype) -> torch.dtype:
    return {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
            torch.float16: torch.int16}[dtype]


def owner_rows(ids: torch.Tensor, weight: torch.Tensor, lo: int, reduce: Reduce) -> torch.Tensor:
    """Embedding rows for ``ids`` (int64, any shape) when each rank holds the rows
    ``[lo, lo + len(weight))`` of the table: the owning rank contributes the row's bit
    pattern, every other rank zeros, and an integer SUM gives the owner's bits exactly
    (``-0.0`` and NaN payloads included)."""
    n = weight.shape[0]
    mine = (ids >= lo) & (ids < lo + n)
    local = torch.where(mine, ids - lo, torch.zeros_like(ids))
    rows = torch.nn.functional.embedding(local, weight)
    bits = rows.view(_bit_dtype(rows.dtype)).to(torch.int64)
    bits = bits.masked_fill_(~mine.unsqueeze(-1), 0).contiguous()
    reduce.sum_(bits)
    return bits.to(_bit_dtype(rows.dtype)).view(rows.dtype)


def concat_last(x: torch.Tensor, reduce: Reduce) -> torch.Tensor:
    """The ranks' shards of ``x`` concatenated along the last dim, in rank order (exact)."""
    return torch.cat(reduce.gather(x.contiguous()), dim=-1)


#: functions whose inner ops the coverage check treats as one (exact, tested) unit
UNITS: tuple[Callable, ...] = (split_k_fixed_b, split_k_matmul, owner_rows, concat_last)
