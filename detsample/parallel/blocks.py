"""One decoder layer's blocks split over the ranks: what each kind needs, and how it is cut.

* **GQA attention** (Llama, Qwen2, Mistral, Qwen3-MoE, Mixtral): q/k/v column-parallel by
  heads, ``o_proj`` row-parallel (:func:`shard_gqa`; the head and KV-head arithmetic is the
  :class:`~detsample.parallel.layout.Layout`'s).
* **MLA** (DeepSeek-V3): the low-rank ``q_a_proj`` / ``kv_a_proj_with_mqa`` and their norms
  are replicated (every rank computes the whole latent, as vLLM does: the latent cache is
  the same on every rank), ``q_b_proj`` (or ``q_proj``) and ``kv_b_proj`` column-parallel by
  heads (each head's rows: its ``qk_nope + qk_rope`` query features, its ``qk_nope + v``
  key / value features), ``o_proj`` row-parallel over the heads' ``v`` features
  (:func:`shard_mla`).
* **Dense MLP** (gate/up/down): gate and up column-parallel, down row-parallel
  (:func:`shard_dense`).
* **MoE block**: the router (``gate``) replicated, the experts placed on ranks
  (:class:`~detsample.parallel.experts.ExpertParallel`), a shared expert as a dense MLP.

Every ``check_*`` raises :class:`~detsample.parallel.layers.TensorParallelError` naming the
module and what it lacks; ``plan`` runs them before any rank starts.
"""

from __future__ import annotations

from typing import Any

import torch

from detsample.parallel.comm import Comm
from detsample.parallel.experts import ExpertParallel, check_experts
from detsample.parallel.layers import RowParallelLinear, TensorParallelError, column_shard

GQA = ("q_proj", "k_proj", "v_proj", "o_proj")
DENSE = ("gate_proj", "up_proj", "down_proj")
#: the children of an MoE block this layout handles (anything else is refused by name)
MOE_PARTS = ("experts", "gate", "shared_experts", "shared_expert", "shared_expert_gate")
#: the shared expert's names: DeepSeek's / Qwen3-MoE's ``shared_experts``, Qwen2-MoE's and
#: Qwen3-Next's ``shared_expert`` (scaled by ``sigmoid(shared_expert_gate(x))``: a
#: ``hidden -> 1`` linear, replicated -- every rank computes it on the same full rows)
SHARED = ("shared_experts", "shared_expert")


def block(rank: int, n: int, world: int) -> slice:
    """Rank ``rank``'s equal block of ``n`` (``world`` divides ``n``)."""
    return slice(rank * (n // world), (rank + 1) * (n // world))


def get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def check_linears(obj: Any, where: str, names: tuple[str, ...]) -> None:
    for n in names:
        if not isinstance(get(obj, n), torch.nn.Linear):
            raise TensorParallelError(f"tensor parallel: {where}.{n} is not an nn.Linear; the Megatron layout needs it")


def check_mlp(mlp: Any, where: str, world: int, cfg: Any) -> int:
    """A dense MLP's per-rank features, or 0 for an MoE block (checked either way)."""
    if hasattr(mlp, "experts"):
        children = [n for n, _ in mlp.named_children()]
        extra = [n for n in children if n not in MOE_PARTS]
        if extra or "gate" not in children:
            raise TensorParallelError(
                f"tensor parallel: {where} ({type(mlp).__name__}) has "
                f"{'no router (gate)' if not extra else 'modules ' + ', '.join(extra)}; the "
                f"expert-parallel layout handles {', '.join(MOE_PARTS)} only"
            )
        check_experts(mlp.experts, f"{where}.experts")
        if "shared_expert_gate" in children:
            check_linears(mlp, where, ("shared_expert_gate",))
        for name in SHARED:
            if getattr(mlp, name, None) is not None:
                check_mlp(getattr(mlp, name), f"{where}.{name}", world, cfg)
        return 0
    check_linears(mlp, where, DENSE)
    n = mlp.gate_proj.out_features
    if n % world:
        what = (
            f"config.intermediate_size={n}"
            if n == getattr(cfg, "intermediate_size", None)
            else f"the {n} intermediate features of {where}"
        )
        raise TensorParallelError(f"tensor parallel: tp={world} does not divide {what}")
    return n // world


def shard_dense(mlp: Any, comm: Comm) -> None:
    rows = block(comm.rank, mlp.gate_proj.out_features, comm.world)
    mlp.gate_proj = column_shard(mlp.gate_proj, rows)
    mlp.up_proj = column_shard(mlp.up_proj, rows)
    mlp.down_proj = RowParallelLinear(mlp.down_proj, rows, comm)


def shard_mlp(mlp: Any, comm: Comm, where: str) -> None:
    if not hasattr(mlp, "experts"):
        shard_dense(mlp, comm)
        return
    mlp.experts = ExpertParallel(mlp.experts, comm, f"{where}.experts")
    for name in SHARED:
        if getattr(mlp, name, None) is not None:
            shard_dense(getattr(mlp, name), comm)


def check_mla(att: Any, where: str, heads: int, kv_heads: int) -> None:
    q = "q_b_proj" if getattr(att, "q_lora_rank", None) is not None else "q_proj"
    check_linears(att, where, (q, "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"))
    if kv_heads != heads:
        raise TensorParallelError(
            f"tensor parallel: {where}: MLA with num_key_value_heads="
            f"{kv_heads} != num_attention_heads={heads} is not covered "
            f"(its keys and values have one head per query head)"
        )


def shard_mla(att: Any, heads: int, comm: Comm) -> None:
    """``att`` (a DeepSeek MLA module) cut to this rank's ``heads`` query heads."""
    r = comm.rank
    q = "q_b_proj" if getattr(att, "q_lora_rank", None) is not None else "q_proj"
    qk, v = att.qk_head_dim, att.v_head_dim
    setattr(att, q, column_shard(getattr(att, q), slice(r * heads * qk, (r + 1) * heads * qk)))
    kv = att.qk_nope_head_dim + v
    att.kv_b_proj = column_shard(att.kv_b_proj, slice(r * heads * kv, (r + 1) * heads * kv))
    att.o_proj = RowParallelLinear(att.o_proj, slice(r * heads * v, (r + 1) * heads * v), comm)
    att.num_heads = heads
    att.num_key_value_groups = 1
