"""RefModelConfig: frozen and validated; errors name the field and the value.

Bug pinned: a config silently accepted with shapes the model cannot run (heads not
dividing the width, a vocabulary without the byte tokens, a bool as a size).
"""

from __future__ import annotations

import dataclasses

import pytest

from detsample.refmodel import RefModelConfig, RefModelError


def test_defaults():
    c = RefModelConfig()
    assert (c.vocab_size, c.n_layers, c.d_model, c.n_heads, c.max_seq_len, c.seed, c.d_ff) == (
        512,
        2,
        64,
        4,
        1024,
        0,
        256,
    )
    assert c.head_dim == 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.seed = 1  # type: ignore[misc]


BAD = [
    ({"vocab_size": 0}, "vocab_size must be >= 1, got 0"),
    ({"vocab_size": 200}, "vocab_size must be >= 257"),
    ({"n_layers": 1.5}, "n_layers must be an integer, got 1.5"),
    ({"d_model": True}, "d_model must be an integer, got True"),
    ({"n_heads": 3}, "d_model must be divisible by n_heads, got d_model=64, n_heads=3"),
    ({"max_seq_len": -4}, "max_seq_len must be >= 1, got -4"),
    ({"seed": -1}, r"seed must be an integer in \[0, 2\*\*64\), got -1"),
    ({"seed": "0"}, "seed must be an integer"),
    ({"d_ff": 0}, "d_ff must be >= 1, got 0"),
    ({"d_model": 8192, "n_heads": 4}, "d_model must be <= 4096, got 8192"),
]


@pytest.mark.parametrize("kwargs,msg", BAD)
def test_invalid(kwargs, msg):
    with pytest.raises(RefModelError, match=msg):
        RefModelConfig(**kwargs)
    assert issubclass(RefModelError, ValueError)


def test_to_dict_roundtrip():
    c = RefModelConfig(seed=9, d_ff=100)
    assert RefModelConfig(**c.to_dict()) == c
