"""Per-row state of a hybrid model's transformers cache: convolution windows and recurrent
states, kept per sequence beside its keys and values, stacked into a batch and split back.

A hybrid (Qwen3.5, Qwen3-Next, Kimi-Linear, LFM2, the Mamba families) keeps, in each of
its linear-attention, state-space or short-convolution layers, transformers'
``LinearAttentionLayer`` state: ``conv_states[i]`` (B, channels, K), the last K inputs of
its convolution, and ``recurrent_states[i]`` (B, heads, d_k, d_v), its recurrent state.
Both are indexed by batch row and nothing else: a row's state is its own slice, so a batch
of rows is assembled by stacking their slices (:func:`install`) and split back by taking
them (:func:`row_states`), each slice copied, never a view of the batch.

What this module does not do is keep padding out of a state: a padded position would
advance a row's convolution window and decay its recurrent state. The adapter
(:class:`~detsample.models.hf.HFCausalLM`) never feeds a state layer a padded position
(it advances rows in segments of equal length); :func:`install` only stacks.

:data:`RowStates` is one row's state: ``{layer: {attribute: {state index: (1, ...) tensor}}}``.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Sequence
from typing import Any

import torch

from detsample.models.base import ModelError

#: the state attributes of transformers' ``LinearAttentionCacheLayerMixin`` carried per row
STATE_ATTRS = ("conv_states", "recurrent_states")

RowStates = dict[int, dict[str, dict[int, torch.Tensor]]]


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
    return [
        f"layer {i} ({type(layer).__name__})"
        for i, layer in enumerate(cache.layers)
        if isinstance(layer, LinearAttentionCacheLayerMixin)
    ]


def own_cache_class(model: Any) -> str | None:
    """The name of a transformers ``Cache`` subclass that ``model``'s modeling module
    defines for itself (MiniMax's ``MiniMaxCache`` keeps its lightning attention's state in
    ``linear_cache``, outside the layers this module carries), or None."""
    try:
        from transformers.cache_utils import Cache
    except ImportError:
        return None
    home = sys.modules.get(type(model).__module__)
    for name, obj in vars(home).items() if home is not None else ():
        if inspect.isclass(obj) and issubclass(obj, Cache) and obj.__module__ == home.__name__:
            return name
    return None


def new_batch_cache(model: Any) -> Any:
    """An empty transformers ``DynamicCache`` laid out for ``model``'s layers (its state
    layers as ``LinearAttentionLayer``)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _state_layers_of(cache: Any) -> list[tuple[int, Any]]:
    return [
        (i, layer)
        for i, layer in enumerate(getattr(cache, "layers", ()))
        if hasattr(layer, "conv_states") and hasattr(layer, "recurrent_states")
    ]


def install(cache: Any, rows: Sequence[RowStates]) -> None:
    """Stack the rows' states into ``cache`` (a :func:`new_batch_cache`), row b at batch
    index b. A row with no state yet (a new sequence) gets zeros of its neighbours' shape:
    the state a layer starts from. Nothing is installed where no row has state (the
    model then starts every row from zeros itself)."""
    for i, layer in _state_layers_of(cache):
        for attr in STATE_ATTRS:
            have = [r[i][attr] for r in rows if i in r and attr in r[i]]
            for idx in sorted({k for h in have for k in h}):
                like = next(h[idx] for h in have if idx in h)
                stacked = torch.cat(
                    [r[i][attr][idx] if i in r and idx in r[i].get(attr, {}) else torch.zeros_like(like) for r in rows]
                )
                if attr == "conv_states":
                    layer.update_conv_state(stacked, state_idx=idx, conv_kernel_size=stacked.shape[-1])
                else:
                    layer.update_recurrent_state(stacked, state_idx=idx)


def row_states(cache: Any, b: int) -> RowStates:
    """Row ``b``'s state in ``cache`` after a forward, each tensor a (1, ...) copy."""
    out: RowStates = {}
    for i, layer in _state_layers_of(cache):
        for attr in STATE_ATTRS:
            held = getattr(layer, attr)
            for idx, t in held.items():
                if isinstance(t, torch.Tensor):
                    out.setdefault(i, {}).setdefault(attr, {})[idx] = t[b : b + 1].clone()
    return out


def refuse_truncate(states: RowStates, n: int, length: int) -> None:
    """ModelError unless ``n == length``: a recurrent state or a convolution window holds
    no earlier position to go back to (speculative decoding needs a key/value model)."""
    if states and n != length:
        where = ", ".join(f"layer {i} ({'/'.join(sorted(a))})" for i, a in sorted(states.items()))
        raise ModelError(
            f"truncate: this cache holds state beside keys and values ({where}), "
            f"which cannot go back from {length} to {n} tokens; speculative "
            f"decoding (which drops rejected drafts) needs a key/value model"
        )
