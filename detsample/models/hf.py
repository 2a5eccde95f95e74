"""Hugging Face causal LMs behind the :class:`~detsample.models.base.CausalLM` protocol.

``HFCausalLM(model, padding="left")`` runs a ragged batch (rows with different cached
lengths and different numbers of new tokens) as ONE padded forward, the way a serving
engine batches requests:

* the batch's past keys/values are one ``DynamicCache`` of length ``P = max past``;
  row b's ``p_b`` cached positions sit at the left end (``padding="right"``) or the right
  end (``padding="left"``) of its ``P`` slots, zeros elsewhere;
* the new tokens are ``T = max new`` columns, row b's ``n_b`` tokens likewise packed
  left or right;
* the 2-D ``attention_mask`` marks the real slots, ``position_ids`` give every real token
  its logical position ``p_b + j`` (RoPE), and causality follows the slot order, which
  is the token order within a row.

Afterwards each row's real slots (past and new) are gathered back into its own
:class:`HFSeqCache`. A row's logits can therefore depend on its neighbours, the padding
and ``T`` only through the kernels: with batch-invariant kernels (``detsample.batch_invariant()``
and the ``"detsample"`` attention) they do not.

A model whose cache keeps state beside keys and values (a linear-attention, state-space
or short-convolution hybrid: :func:`state_layers`) is refused at construction with a
:class:`~detsample.models.base.ModelError`: its state cannot be split into rows and
re-padded as keys and values can.

Works with the cache API of transformers 4.4x (``key_cache``, ``past_key_values=``) and
5.x (``layers[i].keys``, ``cache=``); the choice is made once per adapter from the
model's signature.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from typing import Any, Sequence

import torch

from detsample.invariant import ATTENTION_NAME, batch_invariant, register_attention
from detsample.models.base import ModelError, SeqCache, check_chunks, check_mode

PADDINGS = ("left", "right")


class HFSeqCache(SeqCache):
    """One sequence's keys/values: per layer ``(1, kv_heads, len, head_dim)`` tensors."""

    length_dim = 2


def _cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer (keys, values) of a transformers cache, old or new API."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))  # transformers 4.4x


def use_invariant_attention(model: Any) -> None:
    """Select the ``"detsample"`` attention on a transformers model (registering it)."""
    if not register_attention():
        raise ModelError("the batch-invariant attention needs transformers' "
                         "AttentionInterface (transformers >= 4.48)")
    if callable(getattr(model, "set_attn_implementation", None)):
        model.set_attn_implementation(ATTENTION_NAME)
    else:
        model.config._attn_implementation = ATTENTION_NAME
    if getattr(model.config, "_attn_implementation", None) != ATTENTION_NAME:
        raise ModelError(f"{type(model).__name__} does not take a custom attention "
                         f"function (AttentionInterface); it cannot run batch-invariant")


def state_layers(model: Any) -> list[str]:
    """``"layer i (Class)"`` for each layer whose transformers cache keeps state beside keys
    and values (a hybrid's convolution windows and recurrent states: transformers'
    ``LinearAttentionCacheLayerMixin``); [] for a key/value model or transformers 4.4x."""
    try:
        from transformers.cache_utils import DynamicCache, LinearAttentionCacheLayerMixin
    except ImportError:
        return []
    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 -- a config it cannot read names no hybrid layer
        return []
    return [f"layer {i} ({type(layer).__name__})" for i, layer in enumerate(cache.layers)
            if isinstance(layer, LinearAttentionCacheLayerMixin)]


class HFCausalLM:
    """A ``transformers`` causal LM (``model(input_ids, attention_mask, position_ids,
    cache) -> .logits``) as a :class:`~detsample.models.base.CausalLM`.

    ``model`` is put in eval mode; forwards run under ``torch.no_grad()``. Logits are
    returned as float32 (upcast once when the model computes in bf16/fp16).
    ``batch_invariant=True`` switches the module to the ``"detsample"`` attention
    (``set_attn_implementation``) and runs every forward under
    ``detsample.batch_invariant(portable=portable)`` (docs/batch-invariant.md).
    """

    def __init__(self, model: Any, *, padding: str = "left", name: str | None = None,
                 batch_invariant: bool = False, portable: bool = False) -> None:
        if padding not in PADDINGS:
            raise ModelError(f"padding must be one of {PADDINGS}, got {padding!r}")
        check_mode(batch_invariant, portable)
        cfg = getattr(model, "config", None)
        if cfg is None or not hasattr(cfg, "vocab_size"):
            raise ModelError(f"model must be a Hugging Face causal LM with a config, got "
                             f"{type(model).__name__}")
        hybrid = state_layers(model)
        if hybrid:
            raise ModelError(
                f"{name or type(model).__name__}: its cache keeps state beside keys and values "
                f"({', '.join(hybrid)}); HFCausalLM carries only keys and values between its "
                f"ragged calls, so it cannot run this model: call it with transformers' own "
                f"cache (docs/batch-invariant.md, 'Architectures')")
        self.module = model.eval()
        self.padding = padding
        self.name = name or type(model).__name__
        self.vocab_size = int(cfg.vocab_size)
        self.max_seq_len = getattr(cfg, "max_position_embeddings", None)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.batch_invariant = bool(batch_invariant)
        self.portable = bool(portable)
        if self.batch_invariant:
            use_invariant_attention(model)

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def new_cache(self) -> HFSeqCache:
        return HFSeqCache()

    def with_padding(self, padding: str) -> "HFCausalLM":
        """The same module behind an adapter that pads on the other side."""
        return HFCausalLM(self.module, padding=padding, name=self.name,
                          batch_invariant=self.batch_invariant, portable=self.portable)

    # -- the ragged forward ------------------------------------------------------------
    def forward(self, caches: Sequence[HFSeqCache], chunks: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        for b, c in enumerate(caches):
            if not isinstance(c, HFSeqCache):
                raise ModelError(f"caches[{b}] must be an HFSeqCache from new_cache(), got "
                                 f"{type(c).__name__}")
        ids = check_chunks(caches, chunks, self.vocab_size, self.max_seq_len)
        if not ids:
            return []
        from transformers import DynamicCache

        dev, B = self.device, len(ids)
        past = [len(c) for c in caches]
        new = [len(c) for c in ids]
        P, T = max(past), max(new)
        left = self.padding == "left"
        # slot of the first real past / new entry of each row
        p0 = [P - p if left else 0 for p in past]
        n0 = [T - n if left else 0 for n in new]

        tok = torch.zeros((B, T), dtype=torch.int64)
        pos = torch.zeros((B, T), dtype=torch.int64)
        mask = torch.zeros((B, P + T), dtype=torch.int64)
        for b in range(B):
            tok[b, n0[b]: n0[b] + new[b]] = torch.tensor(ids[b], dtype=torch.int64)
            pos[b, n0[b]: n0[b] + new[b]] = torch.arange(past[b], past[b] + new[b])
            mask[b, p0[b]: p0[b] + past[b]] = 1
            mask[b, P + n0[b]: P + n0[b] + new[b]] = 1
        cache = DynamicCache()
        if P:
            for layer in range(len(caches[past.index(P)].layers)):
                like_k, like_v = caches[past.index(P)].layers[layer]
                k = like_k.new_zeros((B, like_k.shape[1], P, like_k.shape[3]))
                v = like_v.new_zeros((B, like_v.shape[1], P, like_v.shape[3]))
                for b, c in enumerate(caches):
                    if past[b]:
                        k[b, :, p0[b]: p0[b] + past[b]] = c.layers[layer][0][0]
                        v[b, :, p0[b]: p0[b] + past[b]] = c.layers[layer][1][0]
                cache.update(k, v, layer)
        mode = batch_invariant(portable=self.portable) if self.batch_invariant else nullcontext()
        with torch.no_grad(), mode:
            out = self.module(input_ids=tok.to(dev), attention_mask=mask.to(dev),
                              position_ids=pos.to(dev), use_cache=True,
                              **{self._cache_kw: cache})
        logits = out.logits
        layers = _cache_layers(cache)
        results = []
        for b, c in enumerate(caches):
            keep = torch.cat([torch.arange(p0[b], p0[b] + past[b]),
                              torch.arange(P + n0[b], P + n0[b] + new[b])]).to(dev)
            c.layers = [(k[b: b + 1].index_select(2, keep), v[b: b + 1].index_select(2, keep))
                        for k, v in layers]
            c.token_ids.extend(ids[b])
            results.append(logits[b, n0[b]: n0[b] + new[b]].to(torch.float32))
        return results
