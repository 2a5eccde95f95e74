"""Mixture-of-experts layers tensor-parallel: experts placed on ranks, combined in TP=1's order.

A transformers MoE block (Qwen3-MoE, Mixtral, DeepSeek-V3, ...) routes each token to ``k``
of ``E`` experts and sums the ``k`` weighted expert outputs. Here the **router stays
replicated** (every rank scores the same full rows, so every rank routes every token to the
same experts) and the **experts are placed on ranks**: rank ``r`` holds experts
``[r E / tp, (r + 1) E / tp)`` (:func:`expert_range`), whole. :class:`ExpertParallel`
replaces the block's ``experts`` module; for each (token, slot) pair routed to one of its
experts a rank computes the expert's output (up / gate projection, the model's own
``_apply_gate``, down projection) on the whole expert. Then, under
``batch_invariant(portable=True)``:

1. **exchange**: every pair's output comes from the one rank that owns its expert, exactly
   (:func:`detsample.invariant.sharded.owned_rows`: its bit pattern plus zeros in an integer
   SUM), so every rank holds the ``(T k, H)`` outputs TP=1 computes;
2. **combine**: every rank weights and sums them with the ops of TP=1's experts
   implementation (``config._experts_implementation``, ``grouped_mm`` or ``batched_mm``):
   each pair's output times its routing weight, then each token's ``k`` slots summed in
   slot order (``view(T, k, H).sum(dim=1)``, the mode's sum). The same ops on the same bits
   give the same bits.

Why the expert outputs are TP=1's: an element of a portable product is the float32 nearest
to the exact dot product (:mod:`detsample.invariant.exact`), a function of its row and
column alone, so an expert's output for a token does not depend on which other tokens share
the product (TP=1's grouped product holds all of them; a rank's holds its experts' only);
the gate is pointwise on the same values. Nothing is split along a reduction: no expert's
product is divided between ranks, so no combine of partial sums is needed.

With torch's default kernels the block does what a plain expert-parallel layer does: each
rank sums its experts' weighted outputs per token and the ranks' partial sums are added by
torch's floating-point all-reduce -- another summation order than TP=1's, and the negative
control of tests/parallel/test_moe.py. Under the verified (non-portable) mode it is refused
(:data:`~detsample.parallel.layers.VERIFIED_REFUSED`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from detsample.invariant import is_enabled
from detsample.invariant.sharded import owned_rows
from detsample.invariant.state import config
from detsample.parallel.comm import Comm
from detsample.parallel.layers import VERIFIED_REFUSED, TensorParallelError

#: ``config._experts_implementation`` values whose combine :class:`ExpertParallel` repeats
#: (transformers' ``eager`` loop is refused at TP=1 already: the mode does not cover its
#: ``one_hot``, whose ``aten::aminmax`` it meets first)
IMPLEMENTATIONS = ("grouped_mm", "batched_mm")


def expert_range(rank: int, experts: int, world: int) -> range:
    """The experts rank ``rank`` of ``world`` holds: a contiguous block (empty when there
    are fewer experts than ranks and this rank gets none)."""
    return range(rank * experts // world, (rank + 1) * experts // world)


def check_experts(experts: Any, where: str) -> str:
    """The experts implementation of ``experts`` (a transformers experts module, the
    ``use_experts_implementation`` layout: ``gate_up_proj (E, 2 I, H)``, ``down_proj
    (E, H, I)``), or :class:`TensorParallelError` naming what :class:`ExpertParallel` does
    not repeat."""
    for name in ("gate_up_proj", "down_proj"):
        p = getattr(experts, name, None)
        if not isinstance(p, torch.Tensor) or p.dim() != 3:
            raise TensorParallelError(
                f"tensor parallel: {where}.{name} is not a 3-D experts "
                f"parameter (E, out, in); the expert-parallel layout needs it"
            )
    for flag, want in (
        ("has_gate", True),
        ("has_bias", False),
        ("is_transposed", False),
        ("has_post_expert_norm", False),
        ("is_concatenated", True),
    ):
        if getattr(experts, flag, want) != want:
            raise TensorParallelError(
                f"tensor parallel: {where} ({type(experts).__name__}) has "
                f"{flag}={not want}; expert parallelism covers gated, "
                f"bias-free, concatenated [gate; up] experts"
            )
    impl = getattr(getattr(experts, "config", None), "_experts_implementation", None)
    if impl not in IMPLEMENTATIONS:
        raise TensorParallelError(
            f"tensor parallel: {where} runs experts_implementation "
            f"{impl!r}; expert parallelism repeats the combine of "
            f"{', '.join(IMPLEMENTATIONS)} (eager's loop is not covered by "
            f"the batch-invariant mode at TP=1 either)"
        )
    return impl


class ExpertParallel(torch.nn.Module):
    """This rank's experts of ``experts`` (whole); called as transformers calls an experts
    module, ``(hidden (T, H), top_k_index (T, k), top_k_weights (T, k)) -> (T, H)``, it
    returns TP=1's output on every rank under the portable mode (module docstring)."""

    def __init__(self, experts: torch.nn.Module, comm: Comm, where: str = "experts") -> None:
        super().__init__()
        self.impl = check_experts(experts, where)
        self.num_experts = experts.gate_up_proj.shape[0]
        self.mine = expert_range(comm.rank, self.num_experts, comm.world)
        sl = slice(self.mine.start, self.mine.stop)
        self.gate_up_proj = torch.nn.Parameter(experts.gate_up_proj.detach()[sl].clone(), requires_grad=False)
        self.down_proj = torch.nn.Parameter(experts.down_proj.detach()[sl].clone(), requires_grad=False)
        self.act_fn = experts.act_fn
        self._gate = type(experts)._apply_gate
        self.comm = comm

    def extra_repr(self) -> str:
        return (
            f"experts [{self.mine.start}, {self.mine.stop}) of {self.num_experts} "
            f"(rank {self.comm.rank} of {self.comm.world}), combine {self.impl!r}"
        )

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e``'s output for the rows ``x`` (whole expert, this rank's)."""
        h = F.linear(x, self.gate_up_proj[e - self.mine.start])
        return F.linear(self._gate(self, h), self.down_proj[e - self.mine.start])

    def _outputs(self, x: torch.Tensor, flat: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y, mine)``: ``y (T k, H)`` the outputs of the pairs routed to this rank's
        experts (zeros elsewhere), ``mine (T k,)`` which pairs those are."""
        y = x.new_zeros((flat.numel(), x.shape[-1]))
        for e in self.mine:
            pairs = torch.nonzero(flat == e).flatten()
            if pairs.numel():
                y[pairs] = self._expert(e, x[pairs // k]).to(y.dtype)
        return y, (flat >= self.mine.start) & (flat < self.mine.stop)

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        if is_enabled() and config().portable:
            return self.exact(hidden, top_k_index, top_k_weights)
        if is_enabled():
            raise TensorParallelError(VERIFIED_REFUSED)
        return self.plain(hidden, top_k_index, top_k_weights)

    def exact(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        """Every pair's output from its owner (exact), combined as TP=1 combines them."""
        y, mine = self._outputs(hidden, top_k_index.reshape(-1), top_k_index.shape[-1])
        return combine(owned_rows(y, mine, self.comm.reduce), hidden, top_k_index, top_k_weights)

    def plain(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        """A plain expert-parallel layer: this rank's weighted outputs summed per token,
        the ranks' partial sums added by torch's floating-point all-reduce (not TP=1's
        order of the sum)."""
        y, mine = self._outputs(hidden, top_k_index.reshape(-1), top_k_index.shape[-1])
        weights = top_k_weights.masked_fill(~mine.reshape(top_k_index.shape), 0.0)
        part = combine(y, hidden, top_k_index, weights)
        self.comm.float_sum_(part)
        return part


def combine(
    y: torch.Tensor, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The ``(T, H)`` output from every pair's expert output ``y (T k, H)`` (pairs in
    (token, slot) order), with the ops of transformers' ``grouped_mm`` and ``batched_mm``
    experts (``transformers.integrations.moe``): the same ops on the same bits."""
    t, k = top_k_index.shape
    weighted = y * top_k_weights.reshape(-1).unsqueeze(-1)
    return weighted.view(t, k, y.shape[-1]).sum(dim=1).to(hidden.dtype)
