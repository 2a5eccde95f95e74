"""The collectives of one tensor-parallel group, as the exact operations the layers need.

:class:`Comm` wraps a ``torch.distributed`` process group (gloo on CPU, NCCL on CUDA) and
gives the :class:`~detsample.invariant.sharded.Reduce` of the portable layers: MAX (a
maximum does not round: exact in any order), an int64 SUM (integers: exact in any order)
and an all-gather (a copy). ``float_sum_`` is torch's own floating-point all-reduce, the
one a plain Megatron row-parallel layer uses: its bits depend on the ring / tree order of
the backend and on how K was split, which is why the default kernels do not give TP=1's
bits (the negative control of tests/parallel/).

``Comm.single()`` is the group of one rank: every collective is the identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from detsample.invariant.sharded import Reduce


@dataclass(frozen=True)
class Comm:
    """``rank`` of ``world`` ranks in ``group`` (None with ``world == 1``: no collective)."""

    rank: int
    world: int
    group: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.world, bool) or not isinstance(self.world, int) or self.world < 1:
            raise ValueError(f"world must be an int >= 1, got {self.world!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 <= self.rank < self.world:
            raise ValueError(f"rank must be an int in [0, {self.world}), got {self.rank!r}")

    @staticmethod
    def single() -> Comm:
        return Comm(0, 1)

    @staticmethod
    def from_default_group() -> Comm:
        """The initialised default ``torch.distributed`` group."""
        import torch.distributed as dist

        return Comm(dist.get_rank(), dist.get_world_size(), dist.group.WORLD)

    def _all_reduce(self, t: torch.Tensor, op: str) -> None:
        if self.world == 1:
            return
        import torch.distributed as dist

        dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=self.group)

    def max_(self, t: torch.Tensor) -> None:
        """Element-wise maximum over the ranks, in place (exact)."""
        self._all_reduce(t, "MAX")

    def sum_(self, t: torch.Tensor) -> None:
        """Element-wise sum of int64 tensors over the ranks, in place (exact)."""
        if t.dtype != torch.int64:
            raise TypeError(f"the exact sum takes int64 tensors, got {t.dtype}")
        self._all_reduce(t, "SUM")

    def float_sum_(self, t: torch.Tensor) -> None:
        """torch's floating-point all-reduce SUM, in place (the backend's order: NOT the
        bits of a single product)."""
        self._all_reduce(t, "SUM")

    def gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``t`` (same shape on every rank), in rank order."""
        if self.world == 1:
            return [t]
        import torch.distributed as dist

        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t, group=self.group)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier(group=self.group)

    @property
    def reduce(self) -> Reduce:
        """The exact collectives as the portable layers take them."""
        return Reduce(max_=self.max_, sum_=self.sum_, gather=self.gather)
