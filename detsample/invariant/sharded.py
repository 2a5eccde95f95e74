"""The portable product split across tensor-parallel ranks, and the exact collectives around it.

A row-parallel layer (``o_proj``, ``down_proj`` in the Megatron layout) holds a K-range of
the weight on each rank and sees the matching K-range of the activations. The portable
product (:mod:`detsample.invariant.exact`) is the float32 nearest to the exact dot
product, a value no split of K can change; the split computes it as the single product
does, its three stages spread over the ranks:

1. each rank's float64 GEMM ``D_r`` and magnitude bound (block norms) over its K-range;
   every rank gathers them and adds them in rank order, so every rank holds the same
   ``D`` and bound -- one summation of all ``K`` products in which a product goes
   through at most its rank's chunked depth plus one addition per rank, which the bound
   takes -- and so settles the same elements in stage 1;
2. for the elements left (the same on every rank), every rank gathers their exact
   products from all ranks (zero-padded to the longest K-range: zeros add nothing) and
   settles them exactly (stages 2 and 3) on the same data;
3. non-finite rows / columns: one MAX of the flags.

Every rank ends with the bits of TP=1, by construction. The collectives come in a
:class:`Reduce` (``detsample.parallel`` gives one over a ``torch.distributed`` process
group); nothing here imports ``torch.distributed``.

:func:`owner_rows` (the vocab-parallel embedding), :func:`owned_rows` (its rule: also the
expert-parallel exchange of :mod:`detsample.parallel.experts`) and :func:`concat_last` (the
vocab-parallel head) are exact as well: a row is taken from the one rank that owns it
(an integer sum of its bit pattern with zeros) and the shards are concatenated.

The functions of :data:`UNITS` are single units for the coverage check
(:mod:`detsample.invariant.coverage`): the ops they run inside (float64 products, block
norms, collectives) are this module's arithmetic, tested as such (tests/parallel/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from detsample.invariant import exact
from detsample.invariant.exact import Operand


@dataclass(frozen=True)
class Reduce:
    """The collectives of a group of ranks, each in place on a tensor every rank holds
    with the same shape: ``max_`` (element-wise maximum over the ranks), ``sum_`` (an
    element-wise sum of int64 tensors) and ``gather`` (the ranks' tensors, rank order)."""

    max_: Callable[[torch.Tensor], None]
    sum_: Callable[[torch.Tensor], None]
    gather: Callable[[torch.Tensor], list[torch.Tensor]]


def _rank_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """The gathered tensors added in rank order (every rank: the same bits)."""
    total = parts[0].clone()
    for part in parts[1:]:
        total.add_(part)
    return total


def _global_bad(op: Operand, reduce: Reduce) -> Operand:
    """``op`` with the non-finite flags of the whole K (one MAX over the ranks)."""
    flags = op.values.new_zeros(
        op.blocks.shape[:-1] + (1,) if op.dim == -1 else op.blocks.shape[:-2] + (1, op.blocks.shape[-1])
    )
    if op.bad is not None:
        flags = flags.masked_fill_(op.bad, 1.0)
    reduce.max_(flags)
    bad = flags > 0
    return Operand(op.values, op.blocks, bad if bool(bad.any()) else None, op.dim)


def split_k_fixed_b(b: torch.Tensor, reduce: Reduce) -> Operand:
    """This rank's rows ``(K_r, N)`` of a B operand split over K, prepared for
    :func:`split_k_matmul` (a collective: every rank calls it)."""
    return _global_bad(exact.prepare_b(b), reduce)


def _lengths(k: int, reduce: Reduce) -> list[int]:
    parts = reduce.gather(torch.tensor([k], dtype=torch.int64))
    return [int(p[0]) for p in parts]


def split_k_matmul(a: torch.Tensor, fb: Operand, reduce: Reduce) -> torch.Tensor:
    """The portable ``A @ B`` for K split over the ranks: ``a (M, K_r)`` this rank's
    columns of A, ``fb`` its rows of B from :func:`split_k_fixed_b`. Returns ``(M, N)``
    float32 on every rank, bitwise :func:`detsample.invariant.exact.matmul` of the whole
    operands (a collective: every rank calls it)."""
    fa = _global_bad(exact.prepare(a, -1), reduce)
    lengths = _lengths(a.shape[-1], reduce)
    d = _rank_sum(reduce.gather(exact.dot64(fa.values, fb.values).contiguous()))
    mag = _rank_sum(reduce.gather(exact.magnitude(fa, fb).contiguous()))
    adds = exact.depth(max(lengths)) + len(lengths)  # the ranks' trees, then the rank sum
    c, unsettled = exact.first_pass(d, exact.inflate(mag, len(lengths)), adds)
    local = exact.pair_products(fa.values, fb.values)
    width = max(lengths)

    def products(index: tuple[torch.Tensor, ...]) -> torch.Tensor:
        mine = local(index)
        mine = torch.nn.functional.pad(mine, (0, width - mine.shape[1])).contiguous()
        return torch.cat(reduce.gather(mine), dim=1)

    c = exact.settle_at(c, unsettled, products, width * len(lengths))
    return exact.nan_where(c, exact.either(fa.bad, fb.bad))


def _bit_dtype(dtype: torch.dtype) -> torch.dtype:
    return {
        torch.float32: torch.int32,
        torch.float64: torch.int64,
        torch.bfloat16: torch.int16,
        torch.float16: torch.int16,
    }[dtype]


def owned_rows(rows: torch.Tensor, mine: torch.Tensor, reduce: Reduce) -> torch.Tensor:
    """``rows (..., D)`` as every rank holds them where ``mine (...)`` (bool) says this
    rank owns a row -- each row owned by exactly one rank: the owner contributes the row's
    bit pattern, every other rank zeros, and an integer SUM gives the owner's bits on every
    rank, exactly (``-0.0`` and NaN payloads included)."""
    bits = rows.view(_bit_dtype(rows.dtype)).to(torch.int64)
    bits = bits.masked_fill_(~mine.unsqueeze(-1), 0).contiguous()
    reduce.sum_(bits)
    return bits.to(_bit_dtype(rows.dtype)).view(rows.dtype)


def owner_rows(ids: torch.Tensor, weight: torch.Tensor, lo: int, reduce: Reduce) -> torch.Tensor:
    """Embedding rows for ``ids`` (int64, any shape) when each rank holds the rows
    ``[lo, lo + len(weight))`` of the table: the owning rank's row on every rank
    (:func:`owned_rows`)."""
    n = weight.shape[0]
    mine = (ids >= lo) & (ids < lo + n)
    local = torch.where(mine, ids - lo, torch.zeros_like(ids))
    return owned_rows(torch.nn.functional.embedding(local, weight), mine, reduce)


def concat_last(x: torch.Tensor, reduce: Reduce) -> torch.Tensor:
    """The ranks' shards of ``x`` concatenated along the last dim, in rank order (exact)."""
    return torch.cat(reduce.gather(x.contiguous()), dim=-1)


#: functions whose inner ops the coverage check treats as one (exact, tested) unit
UNITS: tuple[Callable, ...] = (split_k_fixed_b, split_k_matmul, owned_rows, owner_rows, concat_last)
