"""Hugging Face causal LMs behind the :class:`~detsample.models.base.CausalLM` protocol.

``HFCausalLM(model, padding="left")`` runs a ragged batch (rows with different cached
lengths and different numbers of new tokens) as padded forwards, the way a serving
engine batches requests: its decode rows (one new token each) in one, its prefill rows
(a prompt or a chunk of one) in another -- a decode row is never padded to a prompt's
length. Each forward:

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

A hybrid (a model whose cache keeps state beside keys and values: the convolution windows
and recurrent states of linear-attention, state-space and short-convolution layers,
:mod:`detsample.models.hybrid`) is run the same way with one difference: a padded position
would advance a row's convolution window and decay its recurrent state, so no state layer
is ever fed one. The rows advance in *segments*: each forward gives every row that still
has tokens the same number of new tokens (the shortest remainder), so new tokens are never
padded; only the attention layers' past keys/values are padded (left or right, masked as
above). Each row's states are stacked into the batch cache and split back after each
segment. The number of forwards is the number of distinct chunk lengths in the call (one
for a decode step), and their positions add up to ``T``. Under the mode the split into
segments is a chunked prefill, which gives a position the bits of one prefill; a row's
logits and states are then those of the row alone. A hybrid whose modeling module keeps its
state in a cache class of its own (MiniMax's ``MiniMaxCache``) is refused at construction
with a :class:`~detsample.models.base.ModelError`. Its cache cannot be truncated (speculative
decoding refuses it by name).

Works with the cache API of transformers 4.4x (``key_cache``, ``past_key_values=``) and
5.x (``layers[i].keys``, ``cache=``); the choice is made once per adapter from the
model's signature.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch

from detsample.invariant import ATTENTION_NAME, batch_invariant, register_attention
from detsample.models.base import ModelError, SeqCache, check_chunks, check_mode
from detsample.models.hybrid import (
    RowStates,
    install,
    new_batch_cache,
    own_cache_class,
    refuse_truncate,
    row_states,
    state_layers,
)

PADDINGS = ("left", "right")


class HFSeqCache(SeqCache):
    """One sequence's keys/values: per layer ``(1, kv_heads, len, head_dim)`` tensors
    (None for a layer that keeps none); a hybrid's ``states``, per state layer its
    convolution windows and recurrent states (:data:`~detsample.models.hybrid.RowStates`)."""

    length_dim = 2

    def __init__(self, hybrid: bool = False) -> None:
        super().__init__()
        self.states: RowStates = {}
        #: False for a hybrid's cache: its states cannot go back (speculative decoding
        #: checks this before it starts)
        self.truncatable = not hybrid

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens; a cache holding state only at its full length."""
        refuse_truncate(self.states, n, len(self))
        if not self.states:
            super().truncate(n)


def _cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer (keys, values) of a transformers cache, old or new API."""
    if hasattr(cache, "layers"):
        return [(getattr(layer, "keys", None), getattr(layer, "values", None)) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))  # transformers 4.4x


def use_invariant_attention(model: Any) -> None:
    """Select the ``"detsample"`` attention on a transformers model (registering it)."""
    if not register_attention():
        raise ModelError("the batch-invariant attention needs transformers' AttentionInterface (transformers >= 4.48)")
    if callable(getattr(model, "set_attn_implementation", None)):
        model.set_attn_implementation(ATTENTION_NAME)
    else:
        model.config._attn_implementation = ATTENTION_NAME
    if getattr(model.config, "_attn_implementation", None) != ATTENTION_NAME:
        raise ModelError(
            f"{type(model).__name__} does not take a custom attention "
            f"function (AttentionInterface); it cannot run batch-invariant"
        )


class HFCausalLM:
    """A ``transformers`` causal LM (``model(input_ids, attention_mask, position_ids,
    cache) -> .logits``) as a :class:`~detsample.models.base.CausalLM`.

    ``model`` is put in eval mode; forwards run under ``torch.no_grad()``. Logits are
    returned as float32 (upcast once when the model computes in bf16/fp16).
    ``batch_invariant=True`` switches the module to the ``"detsample"`` attention
    (``set_attn_implementation``) and runs every forward under
    ``detsample.batch_invariant(portable=portable)`` (docs/batch-invariant.md).
    """

    def __init__(
        self,
        model: Any,
        *,
        padding: str = "left",
        name: str | None = None,
        batch_invariant: bool = False,
        portable: bool = False,
    ) -> None:
        if padding not in PADDINGS:
            raise ModelError(f"padding must be one of {PADDINGS}, got {padding!r}")
        check_mode(batch_invariant, portable)
        cfg = getattr(model, "config", None)
        if cfg is None or not hasattr(cfg, "vocab_size"):
            raise ModelError(f"model must be a Hugging Face causal LM with a config, got {type(model).__name__}")
        hybrid = state_layers(model)
        own = own_cache_class(model) if hybrid else None
        if own:
            raise ModelError(
                f"{name or type(model).__name__}: its cache keeps state beside keys and values "
                f"({', '.join(hybrid)}) in a cache class of its own ({own}); HFCausalLM "
                f"carries transformers' LinearAttentionLayer state between its ragged calls, "
                f"not {own}'s: call it with transformers' own cache "
                f"(docs/batch-invariant.md, 'Architectures')"
            )
        self.hybrid = bool(hybrid)
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
        return HFSeqCache(hybrid=self.hybrid)

    def with_padding(self, padding: str) -> HFCausalLM:
        """The same module behind an adapter that pads on the other side."""
        return HFCausalLM(
            self.module, padding=padding, name=self.name, batch_invariant=self.batch_invariant, portable=self.portable
        )

    # -- the ragged forward ------------------------------------------------------------
    def forward(self, caches: Sequence[HFSeqCache], chunks: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        for b, c in enumerate(caches):
            if not isinstance(c, HFSeqCache):
                raise ModelError(f"caches[{b}] must be an HFSeqCache from new_cache(), got {type(c).__name__}")
        ids = check_chunks(caches, chunks, self.vocab_size, self.max_seq_len)
        if not ids:
            return []
        if not self.hybrid:
            return self._by_kind(list(caches), ids)
        outs: list[list[torch.Tensor]] = [[] for _ in ids]
        done = [0] * len(ids)
        while True:  # segments: every row with tokens left advances by the same number
            live = [b for b in range(len(ids)) if done[b] < len(ids[b])]
            if not live:
                return [torch.cat(o) for o in outs]
            n = min(len(ids[b]) - done[b] for b in live)
            got = self._padded([caches[b] for b in live], [ids[b][done[b] : done[b] + n] for b in live])
            for b, o in zip(live, got):
                outs[b].append(o)
                done[b] += n

    def _by_kind(self, caches: list[HFSeqCache], ids: list[list[int]]) -> list[torch.Tensor]:
        """The decode rows (one new token) in one padded forward and the prefill rows (a
        prompt or a chunk of one) in another, so no decode row is padded to a prompt's
        length (a continuous-batching step that admits a request would otherwise run every
        decode row over the prompt's positions). Under the mode a row's logits do not depend
        on the rows beside it, so the split changes no bit."""
        groups = [[b for b, t in enumerate(ids) if len(t) == 1], [b for b, t in enumerate(ids) if len(t) > 1]]
        out: list[torch.Tensor | None] = [None] * len(ids)
        for rows in groups:
            if rows:
                for b, o in zip(rows, self._padded([caches[b] for b in rows], [ids[b] for b in rows])):
                    out[b] = o
        return out

    def _batch_cache(self, caches: Sequence[HFSeqCache], past: list[int], p0: list[int]) -> Any:
        """The rows' past as one transformers cache: keys/values in ``P = max(past)`` slots
        (row b's at ``p0[b]:``, zeros elsewhere), a hybrid's states stacked by row."""
        from transformers import DynamicCache

        B, P = len(caches), max(past)
        cache = new_batch_cache(self.module) if self.hybrid else DynamicCache()
        longest = caches[past.index(P)]
        for layer, kv in enumerate(longest.layers if P else ()):
            if kv is None:
                continue
            like_k, like_v = kv
            k = like_k.new_zeros((B, like_k.shape[1], P, like_k.shape[3]))
            v = like_v.new_zeros((B, like_v.shape[1], P, like_v.shape[3]))
            for b, c in enumerate(caches):
                if past[b]:
                    k[b, :, p0[b] : p0[b] + past[b]] = c.layers[layer][0][0]
                    v[b, :, p0[b] : p0[b] + past[b]] = c.layers[layer][1][0]
            cache.update(k, v, layer)
        if self.hybrid:
            install(cache, [c.states for c in caches])
        return cache

    def _padded(self, caches: list[HFSeqCache], ids: list[list[int]]) -> list[torch.Tensor]:
        """One padded forward of the ragged batch ``ids`` (see the module docstring)."""
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
            tok[b, n0[b] : n0[b] + new[b]] = torch.tensor(ids[b], dtype=torch.int64)
            pos[b, n0[b] : n0[b] + new[b]] = torch.arange(past[b], past[b] + new[b])
            mask[b, p0[b] : p0[b] + past[b]] = 1
            mask[b, P + n0[b] : P + n0[b] + new[b]] = 1
        cache = self._batch_cache(caches, past, p0)
        mode = batch_invariant(portable=self.portable) if self.batch_invariant else nullcontext()
        with torch.no_grad(), mode:
            out = self.module(
                input_ids=tok.to(dev),
                attention_mask=mask.to(dev),
                position_ids=pos.to(dev),
                use_cache=True,
                **{self._cache_kw: cache},
            )
        if self.hybrid and getattr(out, "past_key_values", cache) is not cache:
            raise ModelError(
                f"{self.name}: the model returned its own cache "
                f"({type(out.past_key_values).__name__}) instead of continuing "
                f"the one HFCausalLM passed; its state cannot be carried per row"
            )
        logits = out.logits
        layers = _cache_layers(cache)
        results = []
        for b, c in enumerate(caches):
            keep = torch.cat([torch.arange(p0[b], p0[b] + past[b]), torch.arange(P + n0[b], P + n0[b] + new[b])]).to(
                dev
            )
            c.layers = [
                None if k is None else (k[b : b + 1].index_select(2, keep), v[b : b + 1].index_select(2, keep))
                for k, v in layers
            ]
            if self.hybrid:
                c.states = row_states(cache, b)
            c.token_ids.extend(ids[b])
            results.append(logits[b, n0[b] : n0[b] + new[b]].to(torch.float32))
        return results
