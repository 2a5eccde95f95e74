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
                               ``mlp.shared_experts`` (``shared_expert``): a dense MLP as
                               above; ``shared_expert_gate`` (Qwen2-MoE) replicated
MLA (DeepSeek-V3)              latent projections replicated, ``q_b_proj`` / ``kv_b_proj``
                               column-parallel by heads, ``o_proj`` row-parallel
                               (:mod:`detsample.parallel.blocks`)
Qwen3.5 ``linear_attn``        gated delta-net: key / value heads in blocks (q, k, v rows of
                               ``in_proj_qkv``, the conv channels, z / b / a, ``A_log``,
                               ``dt_bias``), ``out_proj`` row-parallel; its states per rank
Qwen3.5 ``self_attn``          gated attention: ``q_proj``'s query and gate rows by heads
Nemotron-H ``mixer``           Mamba 2: groups of heads in blocks (``in_proj``'s gate, x, B, C,
                               dt rows, the conv channels, ``A_log``, ``D``, ``dt_bias``, the
                               gated norm's weight), ``out_proj`` row-parallel; attention as
                               GQA's; the ungated MLP's up / down (:mod:`detsample.parallel.hybrid`)
``lm_head``                    vocab-parallel rows, logits gathered (concatenated) on every rank
                               and cut to the real vocabulary
norms, rotary, residuals       replicated (every rank computes them on the same full rows)
=============================  =================================================================

Refused, by name (:class:`~detsample.parallel.layers.TensorParallelError`): a model whose
``config.model_type`` is not in :data:`ARCHITECTURES` (Llama, Qwen2, Mistral, Qwen3-MoE,
Mixtral, DeepSeek-V3, Qwen3.5 text, Nemotron-H, Qwen2-MoE; :data:`REFUSED` says why for
near misses), a model missing one of
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
from detsample.parallel.hybrid import (
    check_gated_attention,
    check_gdn,
    check_mamba2,
    check_plain_mlp,
    shard_gated_attention,
    shard_gdn,
    shard_mamba2,
    shard_plain_mlp,
)
from detsample.parallel.layers import (
    RowParallelLinear,
    TensorParallelError,
    VocabParallelEmbedding,
    VocabParallelHead,
    column_shard,
)

#: ``config.model_type`` -> the attention the runner shards (every layer's MLP is a dense
#: gate/up/down MLP or an MoE block: :mod:`detsample.parallel.blocks`)
ATTENTION = {
    "llama": "gqa",
    "qwen2": "gqa",
    "mistral": "gqa",
    "qwen3_moe": "gqa",
    "mixtral": "gqa",
    "deepseek_v3": "mla",
    "qwen3_5_text": "gated",
    "nemotron_h": "gqa",
    "qwen2_moe": "gqa",
}
#: the ``config.model_type`` values the runner shards
ARCHITECTURES = tuple(ATTENTION)
#: why architectures near those above are refused (the refusal names it)
REFUSED = {
    "olmoe": "its QK-norm normalises all heads together (q_norm over num_heads x head_dim), "
    "which a head split would have to compute across ranks",
    "gpt_oss": "its experts carry biases and interleaved gate/up rows, and its attention sinks are per head",
    "gpt2": "its q, k and v come from one fused c_attn Conv1D (and its MLP is c_fc / c_proj)",
    "qwen3_next": "its gated delta-net packs q, k, v and z per key head in one in_proj_qkvz (and "
    "b, a in in_proj_ba), which the head split does not cut yet",
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
        raise TensorParallelError(
            f"tensor parallel: tp={world} does not divide the padded "
            f"vocabulary {padded} (config.vocab_size={vocab} rounded up "
            f"to a multiple of {VOCAB_PADDING}, as vLLM pads it)"
        )
    return padded


def hf_module(model: Any) -> torch.nn.Module:
    """The ``transformers`` module behind a detsample model adapter (or the module itself)."""
    module = getattr(model, "module", model)
    if not isinstance(module, torch.nn.Module) or not hasattr(module, "config"):
        raise TensorParallelError(
            f"tensor parallel runs Hugging Face causal LMs ({', '.join(ARCHITECTURES)}); "
            f"got {getattr(model, 'name', type(model).__name__)!r} ({type(model).__name__})"
        )
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
            f"supported: {', '.join(ARCHITECTURES)} (docs/tensor-parallel.md, 'What is refused')"
        )
    for path in ("model.layers", "lm_head"):
        if get(module, path) is None:
            raise TensorParallelError(
                f"tensor parallel: {type(module).__name__} has no {path}; the Megatron layout needs it"
            )
    if not isinstance(_embedding(module), torch.nn.Embedding):
        raise TensorParallelError(
            f"tensor parallel: {type(module).__name__}.model has no input "
            f"embedding (nn.Embedding); the Megatron layout needs it"
        )
    return ATTENTION[kind]


def _embedding(module: torch.nn.Module) -> Any:
    inner = module.model
    return inner.get_input_embeddings() if hasattr(inner, "get_input_embeddings") else None


#: Nemotron-H's block types (transformers 5.x's ``layers_block_type`` names, and the
#: config's older spellings) -> the kind its one ``mixer`` is split as
MIXER_KINDS = {
    "linear_attention": "mamba2",
    "mamba": "mamba2",
    "full_attention": "gqa",
    "attention": "gqa",
    "mlp": "plain_mlp",
}
#: the kinds of block that are an attention (their ``head_dim`` is the layout's)
ATTENTIONS = ("gqa", "gated", "mla")


def _blocks(layer: Any, attention: str, where: str) -> list[tuple[str, Any, str]]:
    """``(kind, module, path)`` of a decoder layer's blocks: a Nemotron-H block's one mixer
    (by its ``block_type``), or an attention (``linear_attn``: a gated delta-net; else
    ``self_attn``, of the model's ``attention`` kind) and an ``mlp``."""
    if hasattr(layer, "mixer"):
        kind = MIXER_KINDS.get(getattr(layer, "block_type", None))
        if kind is None:
            raise TensorParallelError(
                f"tensor parallel: {where} is a {getattr(layer, 'block_type', None)!r} block; the "
                f"layout splits {', '.join(MIXER_KINDS)} blocks"
            )
        return [(kind, layer.mixer, f"{where}.mixer")]
    att = (
        ("gdn", layer.linear_attn, f"{where}.linear_attn")
        if hasattr(layer, "linear_attn")
        else (attention, getattr(layer, "self_attn", None), f"{where}.self_attn")
    )
    return [att, ("mlp", get(layer, "mlp"), f"{where}.mlp")]


def _layer_blocks(module: torch.nn.Module, attention: str) -> list[tuple[str, Any, str]]:
    return [b for i, layer in enumerate(module.model.layers) for b in _blocks(layer, attention, f"model.layers.{i}")]


@dataclass(frozen=True)
class _Sizes:
    """What the blocks' checks are given: the TP size, the config's heads, KV heads, the
    attention's head dim, the config."""

    world: int
    heads: int
    kv: int
    head_dim: int
    config: Any


def _check_block(kind: str, mod: Any, where: str, sizes: _Sizes) -> int:
    """One block checked (TensorParallelError naming ``where``); a dense MLP's per-rank
    features (0 for any other block)."""
    if kind == "gdn":
        check_gdn(mod, where, sizes.world)
    elif kind == "mamba2":
        check_mamba2(mod, where, sizes.world)
    elif kind == "mla":
        check_mla(mod, where, sizes.heads, sizes.kv)
    elif kind == "gated":
        check_gated_attention(mod, where, sizes.heads, sizes.head_dim)
    elif kind == "gqa":
        check_linears(mod, where, GQA)
    elif kind == "plain_mlp":
        return check_plain_mlp(mod, where, sizes.world)
    else:
        return check_mlp(mod, where, sizes.world, sizes.config)
    return 0


def _check_layers(module: torch.nn.Module, attention: str, sizes: _Sizes) -> tuple[int, int]:
    """Every layer's blocks checked: ``(intermediate, experts)`` of the layout."""
    inter, experts = 0, 0
    for kind, mod, where in _layer_blocks(module, attention):
        features = _check_block(kind, mod, where, sizes)  # every block checked
        inter = inter or features
        if kind == "mlp" and hasattr(mod, "experts") and not experts:
            experts = mod.experts.gate_up_proj.shape[0]
    return inter, experts


def _head_dim(module: torch.nn.Module, attention: str) -> int:
    """The attention's head dim: the first attention block's ``head_dim``, else hidden / heads."""
    atts = [m for kind, m, _ in _layer_blocks(module, attention) if kind in ATTENTIONS]
    d = getattr(atts[0], "head_dim", None) if atts else None
    return d or module.config.hidden_size // module.config.num_attention_heads


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
        raise TensorParallelError(f"tensor parallel: tp={world} does not divide config.num_attention_heads={heads}")
    if attention == "gqa" and kv % world and world % kv:
        raise TensorParallelError(
            f"tensor parallel: tp={world} neither divides nor is a multiple of config.num_key_value_heads={kv}"
        )
    if heads % kv:
        raise TensorParallelError(
            f"tensor parallel: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}"
        )
    head_dim = _head_dim(module, attention)
    inter, experts = _check_layers(module, attention, _Sizes(world, heads, kv, head_dim, cfg))
    padded = padded_vocab(vocab, world)
    kv_local, repeat = (kv // world, 1) if kv >= world else (1, world // kv)
    return Layout(world, heads // world, kv_local, repeat, head_dim, inter, padded // world, vocab, attention, experts)


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


def _shard_block(kind: str, mod: Any, where: str, layout: Layout, comm: Comm) -> None:
    """One block (checked by :func:`_check_block`) cut, in place, to this rank's shard."""
    if kind == "gdn":
        shard_gdn(mod, comm)
    elif kind == "mamba2":
        shard_mamba2(mod, comm)
    elif kind == "mla":
        shard_mla(mod, layout.heads, comm)
    elif kind == "gated":
        shard_gated_attention(mod, layout.heads, layout.kv_rows(comm.rank), comm)
    elif kind == "gqa":
        _shard_gqa(mod, layout, comm)
    elif kind == "plain_mlp":
        shard_plain_mlp(mod, comm)
    else:
        shard_mlp(mod, comm, where)


def shard_model(model: Any, comm: Comm) -> Layout:
    """Replace, in place, the layers of this rank's copy of ``model`` by their shards
    (the table of the module docstring). Every rank must hold the same weights (the same
    seed or checkpoint): the shards are cut from them. Returns the layout."""
    layout = plan(model, comm.world)
    module = hf_module(model)
    if comm.world == 1:
        return layout
    r = comm.rank
    with torch.no_grad():
        module.model.set_input_embeddings(VocabParallelEmbedding(_embedding(module), layout.vocab_rows(r), comm))
        module.lm_head = VocabParallelHead(module.lm_head, layout.vocab_rows(r), comm, layout.vocab_size)
        for kind, mod, where in _layer_blocks(module, layout.attention):
            _shard_block(kind, mod, where, layout, comm)
    return layout
