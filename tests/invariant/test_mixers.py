"""Recurrent mixers the mode runs by their recurrent update (detsample/invariant/mixers.py).

A gated delta-net of our own (``ToyGatedDeltaNet``: its class name has the fragment the
mode covers, and this module defines the two functions a transformers modeling module
does) computes a prefill by blocks counted from the call's first token and a decode step by
the recurrent update. Under the mode the prefill runs the recurrent update instead, so
prefill == decode == chunked prefill bitwise; with the mode's kernels alone (its guard, and
so the cover, off) they differ (negative control). Only the covered mixer's own state
passes the guard: the same state under another attribute, or at a layer no covered mixer
sits at, is refused by name. The modeling module's function is the original again after
the mode, also after an exception.

Pins: a prefill run by the chunked scan under the mode (a decode step's bits differed from
the prefill's); a covered mixer that let any state of its model pass; a replaced function
left behind after the mode.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from detsample.invariant import batch_invariant, mixers
from detsample.invariant.guard import RefusedLayerError, refused_layers
from detsample.invariant.mixers import COVERS, cover_of, covered
from tests.invariant.architectures import unguarded

D, V, BLOCK, DECAY = 8, 32, 4, 0.9
HERE = sys.modules[__name__]


def torch_chunk_gated_delta_rule(q, k, v, state, chunk_size=BLOCK):
    """The prefill: blocks of ``chunk_size`` from the call's first token. (T, D) -> (T, D), state."""
    outs = []
    for s in range(0, q.shape[0], chunk_size):
        qb, kb, vb = q[s : s + chunk_size], k[s : s + chunk_size], v[s : s + chunk_size]
        i = torch.arange(qb.shape[0], dtype=q.dtype)
        w = torch.tril(DECAY ** (i[:, None] - i[None, :]).clamp(min=0))
        outs.append((qb @ kb.T * w) @ vb + (qb * (DECAY ** (i + 1))[:, None]) @ state)
        state = state * DECAY ** qb.shape[0] + (kb * (DECAY ** (qb.shape[0] - 1 - i))[:, None]).T @ vb
    return torch.cat(outs), state


def torch_recurrent_gated_delta_rule(q, k, v, state):
    """The decode step, for any number of positions: one recurrent update each."""
    outs = []
    for t in range(q.shape[0]):
        state = state * DECAY + k[t : t + 1].T @ v[t : t + 1]
        outs.append(q[t : t + 1] @ state)
    return torch.cat(outs), state


class ToyGatedDeltaNet(torch.nn.Module):
    """Layer 0; keeps its state in ``cache.<attr>[state_layer]``."""

    def __init__(self, attr: str = "recurrent_states", state_layer: int = 0) -> None:
        super().__init__()
        self.layer_idx, self.attr, self.state_layer = 0, attr, state_layer
        self.qkv = torch.nn.Linear(D, 3 * D, bias=False)

    def forward(self, x, cache):
        q, k, v = self.qkv(x).split(D, dim=-1)
        states = getattr(cache, self.attr)
        state = states.get(self.state_layer)
        if state is not None and x.shape[0] == 1:
            out, state = HERE.torch_recurrent_gated_delta_rule(q, k, v, state)
        else:
            out, state = HERE.torch_chunk_gated_delta_rule(q, k, v, torch.zeros(D, D) if state is None else state)
        states[self.state_layer] = state
        return out


class Box:
    def __init__(self) -> None:
        self.recurrent_states: dict[int, torch.Tensor] = {}
        self.other_states: dict[int, torch.Tensor] = {}


class ToyLM(torch.nn.Module):
    def __init__(self, attr: str = "recurrent_states", state_layer: int = 0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(V, D)
        self.mixer = ToyGatedDeltaNet(attr, state_layer)
        self.head = torch.nn.Linear(D, V, bias=False)

    def forward(self, ids, cache=None):
        cache = Box() if cache is None else cache
        return SimpleNamespace(logits=self.head(self.mixer(self.embed(ids), cache)), cache=cache)


IDS = torch.randint(0, V, (11,), generator=torch.Generator().manual_seed(1))


def _splits(model) -> dict[str, torch.Tensor]:
    """The logits of IDS by one prefill, by decode steps, by chunks of 3 and 5."""
    out = {"prefill": model(IDS).logits}
    for name, cuts in (("decode", list(range(1, len(IDS)))), ("chunked", [3, 8])):
        cache, parts = Box(), []
        for a, b in zip([0, *cuts], [*cuts, len(IDS)]):
            parts.append(model(IDS[a:b], cache).logits)
        out[name] = torch.cat(parts)
    return out


def test_the_toy_is_covered_and_not_refused_by_name():
    """Its functions take other arguments than transformers' gated delta rule: the plain
    cover (its recurrent update) runs it, not the fused one."""
    model = ToyLM()
    assert cover_of(model.mixer) is COVERS[1]
    assert type(COVERS[1]) is mixers.Cover and type(COVERS[0]) is mixers.FusedCover
    assert covered(model) == {0: frozenset({"recurrent_states"})}
    assert refused_layers(model) == []


@pytest.mark.parametrize("portable", [False, True], ids=["verified", "portable"])
def test_prefill_decode_and_chunks_agree_bitwise_under_the_mode(portable):
    with torch.no_grad(), batch_invariant(portable=portable):
        got = _splits(ToyLM())
    assert torch.equal(got["decode"], got["prefill"])
    assert torch.equal(got["chunked"], got["prefill"])
    with torch.no_grad(), batch_invariant(portable=portable), unguarded():
        bare = _splits(ToyLM())  # negative control: the chunked scan ran
    assert not torch.equal(bare["decode"], bare["prefill"])


@pytest.mark.parametrize(
    "model,named",
    [
        (ToyLM(attr="other_states"), "Box.other_states[0]"),
        (ToyLM(state_layer=1), "Box.recurrent_states[1]"),
    ],
    ids=["another-attribute", "another-layer"],
)
def test_only_the_covered_mixers_own_state_passes(model, named):
    with torch.no_grad(), batch_invariant(), pytest.raises(RefusedLayerError, match=named.replace("[", r"\[")):
        model(IDS)


def test_the_replaced_function_is_restored_after_the_mode_and_after_an_error():
    original = HERE.torch_chunk_gated_delta_rule
    with torch.no_grad(), batch_invariant():
        ToyLM()(IDS)
        assert HERE.torch_chunk_gated_delta_rule is not original
    assert HERE.torch_chunk_gated_delta_rule is original
    with pytest.raises(ValueError), torch.no_grad(), batch_invariant():
        ToyLM()(IDS)
        raise ValueError("boom")
    assert HERE.torch_chunk_gated_delta_rule is original


def test_a_mixer_whose_module_lacks_the_functions_stays_refused_by_name():
    Stray = type("StrayGatedDeltaNet", (torch.nn.Module,), {"__module__": "collections"})
    model = torch.nn.Sequential(Stray())
    assert cover_of(model[0]) is None
    assert [r.split(":")[0] for r in refused_layers(model)] == ["0 (StrayGatedDeltaNet)"]


class _Keys(SimpleNamespace):
    """A cache layer: ``is_initialized`` when it holds keys."""


class _LinearCache:
    """A stand-in for MiniMaxCache: layer 0 holds a linear state, layer 1 keys."""

    def __init__(self) -> None:
        self.linear_cache = [torch.zeros(1), []]
        self.layers = [_Keys(is_initialized=False, n=0), _Keys(is_initialized=True, n=5)]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].n

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return self.layers[layer_idx].n + query_length, 0


def test_a_seeded_covers_cache_reads_its_past_length_from_a_layer_with_keys():
    """Pins MiniMax's chunked prefill under the mode: transformers' MiniMaxCache read the
    past length from layer 0, a linear layer with an empty key store (0), so a second
    chunk's mask left out the cached keys (a RuntimeError in the mode's attention)."""
    home = SimpleNamespace(_LinearCache=_LinearCache)
    cover = mixers.SeededCover("X", "_LinearCache", "get_linear_cache", frozenset({"linear_cache"}))
    new = cover.replacements(home, mixers.Running())
    cache = _LinearCache()
    assert new["_LinearCache.get_seq_length"](cache) == 5
    assert new["_LinearCache.get_mask_sizes"](cache, 3, 0) == (8, 0)
    assert new["_LinearCache.get_seq_length"](cache, 1) == 5
    cache.layers[1].is_initialized = False  # no keys anywhere: as asked
    assert new["_LinearCache.get_seq_length"](cache) == 0


def test_a_replaced_class_attribute_is_deleted_again_where_it_was_inherited():
    """Pins a method of transformers' cache class left behind after the mode."""
    from transformers.models.minimax import modeling_minimax as home

    from tests.invariant.architectures import BY_NAME, build

    with torch.no_grad(), batch_invariant():
        build(BY_NAME["minimax"])(torch.tensor([[3, 4, 5, 6]]))
        assert "get_seq_length" in vars(home.MiniMaxCache)
    assert "get_seq_length" not in vars(home.MiniMaxCache)
    assert "get_mask_sizes" not in vars(home.MiniMaxCache)
