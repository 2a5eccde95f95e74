"""Recurrent state found by what a model keeps, not by its name (detsample/invariant/recurrent.py
and its use by the guard).

A linear-attention layer of our own (``DecayMixer``: a name no list has) keeps a decayed
``k^T v`` state: its prefill sums it in blocks relative to the call, its decode step by a
recurrent update, so under the mode's kernels decode and prefill still give other bits
(negative control, with the guard's hooks off). Wherever it keeps that state -- in a cache
object of the user's, in a transformers ``DynamicCache`` beside the keys and values, in a
module attribute or in place in a buffer, or only when asked to cache (a first forward with
``use_cache=False``) -- the mode refuses it by name (``RefusedLayerError``) instead of
returning variant logits; a plain key/value cache and a stateless model pass.

Pins: a recurrent layer not on the guard's name list run silently variant under the mode
(MiniMax's lightning attention did); a refusal that does not name where the state is and
which layer keeps it; a refused model that runs on a retry.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from detsample.invariant import batch_invariant
from detsample.invariant.guard import RefusedLayerError, refused_layers
from detsample.invariant.recurrent import KV_STORES, cache_state, holders, mutated, snapshot
from tests.invariant.architectures import unguarded

D, V, BLOCK = 8, 32, 4


def prefill_scan(q, k, v, decay: float, state):
    """Blocks of BLOCK positions from the call's first token: (T, D) -> (T, D), new state."""
    outs = []
    for s in range(0, q.shape[0], BLOCK):
        qb, kb, vb = q[s : s + BLOCK], k[s : s + BLOCK], v[s : s + BLOCK]
        n = qb.shape[0]
        i = torch.arange(n, dtype=q.dtype)
        w = torch.tril(decay ** (i[:, None] - i[None, :]).clamp(min=0))
        outs.append((qb @ kb.T * w) @ vb + (qb * (decay ** (i + 1))[:, None]) @ state)
        state = state * decay**n + (kb * (decay ** (n - 1 - i))[:, None]).T @ vb
    return torch.cat(outs), state


def decode_step(q, k, v, decay: float, state):
    """One position by the recurrent update: (1, D) -> (1, D), new state."""
    state = state * decay + k.T @ v
    return q @ state, state


class DecayMixer(torch.nn.Module):
    """A decayed linear attention; ``where`` says where it keeps its state between calls."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.layer_idx, self.where, self.decay = 0, where, 0.9
        self.qkv = torch.nn.Linear(D, 3 * D, bias=False)
        if where == "buffer":
            self.register_buffer("state", torch.zeros(D, D))

    def _load(self, cache):
        if self.where == "buffer":
            return self.state if bool(self.state.any()) else None
        if self.where == "module":
            return getattr(self, "kept", None)
        if self.where == "dynamic":
            return getattr(cache, "mixer_states", {}).get(0) if cache is not None else None
        return cache.states.get(0) if cache is not None else None

    def _save(self, cache, state) -> None:
        if self.where == "buffer":
            self.state.copy_(state)
        elif self.where == "module":
            self.kept = state
        elif cache is not None and self.where == "dynamic":
            cache.mixer_states = {0: state}
        elif cache is not None:
            cache.states[0] = state

    def forward(self, x, cache=None):
        q, k, v = self.qkv(x).split(D, dim=-1)
        state = self._load(cache)
        if state is not None and x.shape[0] == 1:
            out, state = decode_step(q, k, v, self.decay, state)
        else:
            out, state = prefill_scan(q, k, v, self.decay, torch.zeros(D, D) if state is None else state)
        self._save(cache, state)
        return out


class StateBox:
    """A cache of the user's own (not a transformers class)."""

    def __init__(self) -> None:
        self.states: dict[int, torch.Tensor] = {}


class TinyLM(torch.nn.Module):
    def __init__(self, where: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(V, D)
        self.mixer = DecayMixer(where)
        self.head = torch.nn.Linear(D, V, bias=False)

    def forward(self, ids, cache=None, use_cache=True):
        if use_cache and cache is None and self.mixer.where in ("box", "dynamic"):
            cache = StateBox() if self.mixer.where == "box" else _dynamic_cache()
        logits = self.head(self.mixer(self.embed(ids), cache if use_cache else None))
        return SimpleNamespace(logits=logits, cache=cache) if use_cache else logits


def _dynamic_cache():
    from transformers import DynamicCache

    return DynamicCache()


IDS = torch.randint(0, V, (10,), generator=torch.Generator().manual_seed(1))


def _decode_logits(model, cache=None):
    out = [model(IDS[:1], cache=cache)]
    for t in range(1, len(IDS)):
        out.append(model(IDS[t : t + 1], cache=cache))
    return torch.cat([o.logits if hasattr(o, "logits") else o for o in out])


def test_the_layer_is_variant_under_the_mode_without_the_guard():
    """Negative control: the mode's kernels alone do not make it invariant."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(10, D) for _ in range(3))
    with torch.no_grad(), batch_invariant(), unguarded():
        full, _ = prefill_scan(q, k, v, 0.9, torch.zeros(D, D))
        state, steps = torch.zeros(D, D), []
        for t in range(10):
            o, state = decode_step(q[t : t + 1], k[t : t + 1], v[t : t + 1], 0.9, state)
            steps.append(o)
    assert not torch.equal(torch.cat(steps), full)
    assert torch.allclose(torch.cat(steps), full, atol=1e-5)  # the same function


WHERE = [
    ("box", "StateBox.states[0]"),
    ("dynamic", "DynamicCache.mixer_states[0]"),
    ("module", "mixer.kept"),
    ("buffer", "mixer.state"),
]


@pytest.mark.parametrize("where,named", WHERE, ids=[w for w, _ in WHERE])
def test_state_kept_anywhere_is_refused_by_what_it_is(where, named):
    model = TinyLM(where)
    assert refused_layers(model) == []  # no name list knows it
    cache = StateBox() if where == "box" else _dynamic_cache() if where == "dynamic" else None
    with torch.no_grad(), batch_invariant():
        with pytest.raises(RefusedLayerError) as e:
            _decode_logits(model, cache)
        assert named in str(e.value)
        if where in ("box", "dynamic"):
            assert "kept by mixer (DecayMixer)" in str(e.value)
        with pytest.raises(RefusedLayerError):  # a retry does not pass
            model(IDS, cache=None)


class KwargsLM(TinyLM):
    """Takes ``use_cache`` through ``**kwargs`` only, with a config that has it (as
    transformers' Granite 4 hybrid does)."""

    def __init__(self) -> None:
        super().__init__("box")
        self.config = SimpleNamespace(use_cache=False)

    def forward(self, ids, cache=None, **kwargs):
        return super().forward(ids, cache, kwargs.get("use_cache", self.config.use_cache))


@pytest.mark.parametrize(
    "model,kwargs", [(TinyLM("box"), {"use_cache": False}), (KwargsLM(), {})], ids=["named", "through-kwargs"]
)
def test_a_first_forward_without_a_cache_is_probed_with_one(model, kwargs):
    with torch.no_grad(), batch_invariant(), pytest.raises(RefusedLayerError, match="StateBox.states"):
        model(IDS, **kwargs)


def test_a_key_value_cache_and_a_stateless_model_pass():
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), 0)
    assert {"keys", "values"} <= KV_STORES
    assert cache_state(cache) == []
    cache.layers[0].extra = torch.randn(2)
    assert [s.where for s in cache_state(cache)] == ["DynamicCache.layers[0].extra"]
    model = torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.SiLU())
    with torch.no_grad(), batch_invariant():
        model(torch.randn(3, D))
        model(torch.randn(3, D))  # no refusal, no probe


def test_holders_are_objects_among_arguments_and_outputs():
    box = StateBox()
    out = {"logits": torch.zeros(2), "cache": box, "hidden": (torch.zeros(1),)}
    assert holders((torch.zeros(1),), {"cache": box, "mask": torch.ones(1)}, out) == [box]
    assert holders((), {}, torch.zeros(1)) == []


def test_module_state_snapshot_sees_replacement_and_in_place_writes():
    m = DecayMixer("buffer")
    before = snapshot(m)
    assert mutated(m, before) == []
    m.state.add_(1.0)
    m.kept = torch.ones(2)
    assert sorted(s.where for s in mutated(m, before)) == ["<model>.kept", "<model>.state"]
