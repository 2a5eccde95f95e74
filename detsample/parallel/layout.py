"""The Megatron layout of a Hugging Face causal LM over ``world`` ranks, and what is refused.

:func:`plan` checks a model and a TP size and says how it splits (:class:`Layout`);
:func:`shard_model` replaces, in place, the layers of one rank's copy of the model by
their shards (:mod:`detsample.parallel.layers`):

=============================  =================================================================
``embed_tokens``               vocab-parallel rows of the padded vocabulary (:func:`padded_vocab`;
                               :class:`~detsample.parallel.layers.VocabParallelEmbedding`)
``self_attn.q_proj``           column-parallel: this rank's query heads (contiguous block)
``self_attn.k_proj / v_proj``  column-parallel: this rank's KV heads; when ``world`` exceeds
                               the KV heads, each KV head is replicated on the
                               ``world / kv_heads`` ranks whose query heads use it
``self_attn.o_proj``           row-parallel (the exact combine under the portable mode)
``mlp.gate_proj / up_proj``    column-parallel: this rank's intermediate features
``mlp.down_proj``              row-parallel
MoE ``mlp.gate`` (router)      replicated; ``mlp.experts``: placed on ranks, whole
                               (:class:`~detsample.parallel.experts.ExpertParallel`);
                               ``mlp.shared_experts``: a dense MLP as above
MLA (DeepSeek-V3)              latent projections replicated, ``q_b_proj`` / ``kv_b_proj``
                               column-parallel by heads, ``o_proj`` row-parallel
                               (:mod:`detsample.parallel.blocks`)
``lm_head``                    vocab-parallel rows, logits gathered (concatenated) on every rank
                               and cut to the real vocabulary
norms, rotary, residuals       replicated (every rank computes them on the same full rows)
=============================  =================================================================

Refused, by name (:class:`~detsample.parallel.layers.TensorParallelError`): a model whose
``config.model_type`` is not in :data:`ARCHITECTURES` (Llama, Qwen2, Mistral, Qwen3-MoE,
Mixtral, DeepSeek-V3; :data:`REFUSED` says why for near misses), a model missing one of
those modules, and a ``world`` that does not divide the attention heads, a dense MLP's
intermediate features or the padded vocabulary, or neither divides nor is a multiple of the
KV heads (GQA). The vocabulary is padded as vLLM pads it
(a multiple of 64, split in ``world`` equal parts; the padding rows are zeros and their
logit columns are cut before anything reads the logits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from detsample.parallel.blocks import GQA, check_linears, check_mla, check_mlp, get, shard_mla, shard_mlp
from detsample.parallel.comm import Comm
from detsample.parallel.layers import (
    RowParallelLinear,
    TensorParallelError,
    VocabParallelEmbedding,
    VocabParallelHead,
    column_shard,
)

#: ``config.model_type`` -> the attention the runner shards (every layer's MLP is a dense
#: gate/up/down MLP or an MoE block: :mod:`detsample.parallel.blocks`)
ATTENTION = {"llama": "gqa", "qwen2": "gqa", "mistral": "gqa", "qwen3_moe": "gqa",
             "mixtral": "gqa", "deepseek_v3": "mla"}
#: the ``config.model_type`` values the runner shards
ARCHITECTURES = tuple(ATTENTION)
#: why architectures near those above are refused (the refusal names it)
REFUSED = {
    "olmoe": "its QK-norm normalises all heads together (q_norm over num_heads x head_dim), "
             "which a head split would have to compute across ranks",
    "qwen2_moe": "its shared expert is scaled by a sigmoid gate (shared_expert_gate) the "
                 "expert-parallel layout does not handle",
    "gpt_oss": "its experts carry biases and interleaved gate/up rows, and its attention sinks "
               "are per head",
    "gpt2": "its q, k and v come from one fused c_attn Conv1D (and its MLP is c_fc / c_proj)",
}


@dataclass(frozen=True)
class Layout:
    """How a model splits over ``world`` ranks: per-rank query ``heads`` and ``kv_heads``
    (``kv_repeat`` ranks share each KV head), ``head_dim``, the dense MLP's
    ``intermediate`` features (the first dense MLP's; 0 when every layer is MoE) and
    ``vocab`` rows per rank of the padded vocabulary (:func:`padded_vocab`), whose first
    ``vocab_size`` rows are the model's; ``attention``: ``"gqa"`` or ``"mla"``;
    ``experts``: the routed experts of an MoE layer (0: dense), placed on ranks in
    contiguous blocks (:func:`~detsample.parallel.experts.expert_range`)."""

    world: int
    heads: int
    kv_heads: int
    kv_repeat: int
    head_dim: int
    intermediate: int
    vocab: int
    vocab_size: int
    attention: str = "gqa"
    experts: int = 0

    def q_rows(self, rank: int) -> slice:
        n = self.heads * self.head_dim
        return slice(rank * n, (rank + 1) * n)

    def kv_rows(self, rank: int) -> slice:
        n = self.kv_heads * self.head_dim
        block = rank // self.kv_repeat
        return slice(block * n, (block + 1) * n)

    def mlp_rows(self, rank: int) -> slice:
        return slice(rank * self.intermediate, (rank + 1) * self.intermediate)

    def vocab_rows(self, rank: int) -> slice:
        return slice(rank * self.vocab, (rank + 1) * self.vocab)


#: vLLM's ``DEFAULT_VOCAB_PADDING_SIZE``: the vocabulary is padded to a multiple of it
VOCAB_PADDING = 64


def padded_vocab(vocab: int, world: int) -> int:
    """vLLM's ``VocabParallelEmbedding`` rule: ``vocab`` rounded up to a multiple of
    :data:`VOCAB_PADDING` (``pad_vocab_size``), then split in ``world`` equal parts
    (``divide``: ``world`` must divide the padded size, else refused by name)."""
    padded = -(-vocab // VOCAB_PADDING) * VOCAB_PADDING
    if padded % world:
        raise TensorParallelError(f"tensor parallel: tp={world} does not divide the padded "
                                  f"vocabulary {padded} (config.vocab_size={vocab} rounded up "
                                  f"to a multiple of {VOCAB_PADDING}, as vLLM pads it)")
    return padded


def hf_module(model: Any) -> torch.nn.Module:
    """The ``transformers`` module behind a detsample model adapter (or the module itself)."""
    module = getattr(model, "module", model)
    if not isinstance(module, torch.nn.Module) or not hasattr(module, "config"):
        raise TensorParallelError(
            f"tensor parallel runs Hugging Face causal LMs ({', '.join(ARCHITECTURES)}); "
            f"got {getattr(model, 'name', type(model).__name__)!r} ({type(model).__name__})")
    return module


def _field(cfg: Any, name: str) -> int:
    v = getattr(cfg, name, None)
    if not isinstance(v, int) or v < 1:
        raise TensorParallelError(f"tensor parallel: config.{name} must be an int >= 1, got {v!r}")
    return v


def _architecture(module: torch.nn.Module) -> str:
    kind = getattr(module.config, "model_type", None)
    if kind not in ATTENTION:
        why = f" ({REFUSED[kind]})" if kind in REFUSED else ""
        raise TensorParallelError(
            f"tensor parallel: model_type {kind!r} ({type(module).__name__}) is not supported{why}; "
            f"supported: {', '.join(ARCHITECTURES)} (docs/tensor-parallel.md, 'What is refused')")
    for path in ("model.embed_tokens", "model.layers", "lm_head"):
        if get(module, path) is None:
            raise TensorParallelError(f"tensor parallel: {type(module).__name__} has no "
                                      f"{path}; the Megatron layout needs it")
    return ATTENTION[kind]


def _check_layers(module: torch.nn.Module, attention: str, world: int, heads: int,
                  kv: int) -> tuple[int, int]:
    """Every layer's blocks checked: ``(intermediate, experts)`` of the layout."""
    inter, experts = 0, 0
    for i, layer in enumerate(module.model.layers):
        where = f"model.layers.{i}"
        if attention == "mla":
            check_mla(layer.self_attn, f"{where}.self_attn", heads, kv)
        else:
            check_linears(layer, f"{where}.self_attn", tuple(f"self_attn.{n}" for n in GQA))
        features = check_mlp(get(layer, "mlp"), f"{where}.mlp", world, module.config)
        inter = inter or features
        if hasattr(layer.mlp, "experts") and not experts:
            experts = layer.mlp.experts.gate_up_proj.shape[0]
    return inter, experts


def plan(model: Any, world: int) -> Layout:
    """The :class:`Layout` of ``model`` (a HF module or a detsample adapter of one) over
    ``world`` ranks, or :class:`TensorParallelError` naming what is refused."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise TensorParallelError(f"tp must be an int >= 1, got {world!r}")
    module = hf_module(model)
    attention, cfg = _architecture(module), module.config
    heads, kv = _field(cfg, "num_attention_heads"), _field(cfg, "num_key_value_heads")
    vocab = _field(cfg, "vocab_size")
    if heads % world:
        raise TensorParallelError(f"tensor parallel: tp={world} does not divide "
                                  f"config.num_attention_heads={heads}")
    if attention == "gqa" and kv % world and world % kv:
        raise TensorParallelError(f"tensor parallel: tp={world} neither divides nor is a "
                                  f"multiple of config.num_key_value_heads={kv}")
    if heads % kv:
        raise TensorParallelError(f"tensor parallel: num_attention_heads={heads} is not a "
                                  f"multiple of num_key_value_heads={kv}")
    inter, experts = _check_layers(module, attention, world, heads, kv)
    padded = padded_vocab(vocab, world)
    layers = module.model.layers
    head_dim = getattr(layers[0].self_attn, "head_dim", None) if len(layers) else None
    head_dim = head_dim or cfg.hidden_size // heads
    kv_local, repeat = (kv // world, 1) if kv >= world else (1, world // kv)
    return Layout(world, heads // world, kv_local, repeat, head_dim, inter, padded // world,
                  vocab, attention, experts)


def _shard_gqa(att: Any, layout: Layout, comm: Comm) -> None:
    r = comm.rank
    att.q_proj = column_shard(att.q_proj, layout.q_rows(r))
    att.k_proj = column_shard(att.k_proj, layout.kv_rows(r))
    att.v_proj = column_shard(att.v_proj, layout.kv_rows(r))
    att.o_proj = RowParallelLinear(att.o_proj, layout.q_rows(r), comm)
    att.num_key_value_groups = layout.heads // layout.kv_heads
    for attr in ("num_heads", "num_attention_heads"):
        if hasattr(att, attr):
            setattr(att, attr, layout.heads)
    if hasattr(att, "num_key_value_heads"):
        att.num_key_value_heads = layout.kv_heads


def shard_model(model: Any, comm: Comm) -> Layout:
    """Replace, in place, the layers of this rank's copy of ``model`` by their shards
    (the table of the module docstring). Every rank must hold the same weights (the same
    seed or checkpoint): the shards are cut from them. Returns the layout."""
    layout = plan(model, comm.world)
    module = hf_module(model)
    if comm.world == 1:
        return layout
    r = comm.rank
    inner = module.model
    with torch.no_grad():
        inner.embed_tokens = VocabParallelEmbedding(inner.embed_tokens, layout.vocab_rows(r), comm)
        module.lm_head = VocabParallelHead(module.lm_head, layout.vocab_rows(r), comm,
                                           layout.vocab_size)
        for i, layer in enumerate(inner.layers):
            if layout.attention == "mla":
                shard_mla(layer.self_attn, layout.heads, comm)
            else:
                _shard_gqa(layer.self_attn, layout, comm)
            shard_mlp(layer.mlp, comm, f"model.layers.{i}.mlp")
    return layout
