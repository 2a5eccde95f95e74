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
``lm_head``                    vocab-parallel rows, logits gathered (concatenated) on every rank
                               and cut to the real vocabulary
norms, rotary, residuals       replicated (every rank computes them on the same full rows)
=============================  =================================================================

Refused, by name (:class:`~detsample.parallel.layers.TensorParallelError`): a model whose
``config.model_type`` is not in :data:`ARCHITECTURES` (Llama, Qwen2, Mistral: the
dense decoder layout above), a model missing one of those modules, and a ``world`` that
does not divide the attention heads, the intermediate size or the padded vocabulary, or
neither divides nor is a multiple of the KV heads. The vocabulary is padded as vLLM pads it
(a multiple of 64, split in ``world`` equal parts; the padding rows are zeros and their
logit columns are cut before anything reads the logits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from detsample.parallel.comm import Comm
from detsample.parallel.layers import (RowParallelLinear, TensorParallelError, VocabParallelEmbedding,
                                       VocabParallelHead, column_shard)

#: ``config.model_type`` values of the dense decoder layout the runner shards
ARCHITECTURES = ("llama", "qwen2", "mistral")

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Layout:
    """How a model splits over ``world`` ranks: per-rank query ``heads`` and ``kv_heads``
    (``kv_repeat`` ranks share each KV head), ``head_dim``, ``intermediate`` features
    and ``vocab`` rows per rank of the padded vocabulary (:func:`padded_vocab`), whose
    first ``vocab_size`` rows are the model's."""

    world: int
    heads: int
    kv_heads: int
    kv_repeat: int
    head_dim: int
    intermediate: int
    vocab: int
    vocab_size: int

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


def plan(model: Any, world: int) -> Layout:
    """The :class:`Layout` of ``model`` (a HF module or a detsample adapter of one) over
    ``world`` ranks, or :class:`TensorParallelError` naming what is refused."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise TensorParallelError(f"tp must be an int >= 1, got {world!r}")
    module = hf_module(model)
    cfg = module.config
    kind = getattr(cfg, "model_type", None)
    if kind not in ARCHITECTURES:
        raise TensorParallelError(
            f"tensor parallel: model_type {kind!r} ({type(module).__name__}) is not supported; "
            f"supported: {', '.join(ARCHITECTURES)} (docs/tensor-parallel.md, 'What is refused')")
    inner = getattr(module, "model", None)
    for path in ("model.embed_tokens", "model.layers", "lm_head"):
        if _get(module, path) is None:
            raise TensorParallelError(f"tensor parallel: {type(module).__name__} has no "
                                      f"{path}; the Megatron layout needs it")
    for i, layer in enumerate(inner.layers):
        for group, names in (("self_attn", _ATTN), ("mlp", _MLP)):
            for n in names:
                if not isinstance(_get(layer, f"{group}.{n}"), torch.nn.Linear):
                    raise TensorParallelError(f"tensor parallel: model.layers.{i}.{group}.{n} "
                                              f"is not an nn.Linear; the Megatron layout needs it")
    heads, kv = _field(cfg, "num_attention_heads"), _field(cfg, "num_key_value_heads")
    inter, vocab = _field(cfg, "intermediate_size"), _field(cfg, "vocab_size")
    head_dim = inner.layers[0].self_attn.head_dim if len(inner.layers) else cfg.hidden_size // heads
    for name, value in (("num_attention_heads", heads), ("intermediate_size", inter)):
        if value % world:
            raise TensorParallelError(f"tensor parallel: tp={world} does not divide "
                                      f"config.{name}={value}")
    padded = padded_vocab(vocab, world)
    if kv % world and world % kv:
        raise TensorParallelError(f"tensor parallel: tp={world} neither divides nor is a "
                                  f"multiple of config.num_key_value_heads={kv}")
    if heads % kv:
        raise TensorParallelError(f"tensor parallel: num_attention_heads={heads} is not a "
                                  f"multiple of num_key_value_heads={kv}")
    kv_local, repeat = (kv // world, 1) if kv >= world else (1, world // kv)
    return Layout(world, heads // world, kv_local, repeat, head_dim, inter // world,
                  padded // world, vocab)


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


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
        for layer in inner.layers:
            att, mlp = layer.self_attn, layer.mlp
            att.q_proj = column_shard(att.q_proj, layout.q_rows(r))
            att.k_proj = column_shard(att.k_proj, layout.kv_rows(r))
            att.v_proj = column_shard(att.v_proj, layout.kv_rows(r))
            att.o_proj = RowParallelLinear(att.o_proj, layout.q_rows(r), comm)
            att.num_key_value_groups = layout.heads // layout.kv_heads
            for attr in ("num_heads", "num_attention_heads"):
                if hasattr(att, attr):
                    setattr(att, attr, layout.heads)
            for attr in ("num_key_value_heads",):
                if hasattr(att, attr):
                    setattr(att, attr, layout.kv_heads)
            mlp.gate_proj = column_shard(mlp.gate_proj, layout.mlp_rows(r))
            mlp.up_proj = column_shard(mlp.up_proj, layout.mlp_rows(r))
            mlp.down_proj = RowParallelLinear(mlp.down_proj, layout.mlp_rows(r), comm)
    return layout
