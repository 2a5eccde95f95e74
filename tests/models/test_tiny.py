"""Tiny HF models: offline, seeded, the same bits every build, the caller's RNG untouched.

Pins: weights that depend on the global RNG (a test that seeds torch elsewhere would change
the model) or a builder that reseeds the global RNG behind the caller's back.
"""

from __future__ import annotations

import pytest
import torch

from detsample.models import ModelError, build_tiny
from detsample.models.tiny import TINY_CONFIGS

NAMES = sorted(TINY_CONFIGS)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_bits_and_global_rng_untouched(name):
    state = torch.random.get_rng_state()
    a, b = build_tiny(name, seed=3), build_tiny(name, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    c = build_tiny(name, seed=4)
    assert not torch.equal(next(c.parameters()), next(a.parameters()))


@pytest.mark.parametrize("name", NAMES)
def test_float32_grouped_query_attention(name):
    m = build_tiny(name)
    cfg = m.config
    assert all(p.dtype == torch.float32 for p in m.parameters())
    assert cfg.num_key_value_heads < cfg.num_attention_heads and cfg.vocab_size == 512


def test_unknown_tiny_model_is_named():
    with pytest.raises(ModelError, match="unknown tiny model 'hf-tiny-gpt'"):
        build_tiny("hf-tiny-gpt")
