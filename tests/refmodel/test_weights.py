"""Weights: generated from the seed alone; safetensors save/load round-trips bitwise.

Bugs pinned: weights depending on global RNG state (irreproducible models), a lossy or
silently-wrong load (a file with wrong shapes/dtypes accepted).
"""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import save_file

from detsample.refmodel import RefModel, RefModelConfig, RefModelError
from detsample.refmodel import weights as W


def test_generation_is_pure_and_ignores_global_rng():
    cfg = RefModelConfig()
    torch.manual_seed(123)
    a = W.generate(cfg)
    torch.manual_seed(456)
    _ = torch.rand(10)
    b = W.generate(cfg)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_seed_changes_every_matrix():
    a, b = W.generate(RefModelConfig(seed=0)), W.generate(RefModelConfig(seed=1))
    for k in a:
        if k != "exp_table":
            assert not torch.equal(a[k], b[k]), k
    assert torch.equal(a["exp_table"], b["exp_table"])


UNIFORM_CASES = [(0, "x", (1000,), -3, 3), (7, "y", (50, 20), 0, 0), (2**64 - 1, "z", (10,), -1, 1)]


@pytest.mark.parametrize("seed,name,shape,low,high", UNIFORM_CASES)
def test_uniform_ints(seed, name, shape, low, high):
    t = W.uniform_ints(seed, name, shape, low, high)
    assert t.dtype == torch.int64 and tuple(t.shape) == shape
    assert int(t.min()) >= low and int(t.max()) <= high
    if high - low >= 2 and t.numel() >= 1000:
        assert set(t.unique().tolist()) == set(range(low, high + 1))


def test_exp_table_monotone_and_ends_at_zero():
    t = W.generate(RefModelConfig())["exp_table"]
    assert int(t[0]) == 2**16 and int(t[-1]) == 0
    assert bool((t[1:] <= t[:-1]).all())


def test_save_load_roundtrip_bitwise(tmp_path):
    cfg = RefModelConfig(seed=3, d_model=32, n_heads=2, max_seq_len=128)
    m = RefModel(cfg)
    path = tmp_path / "ref.safetensors"
    m.save(path)
    m2 = RefModel.load(path)
    assert m2.config == cfg
    assert all(torch.equal(m.weights[k], m2.weights[k]) for k in m.weights)
    seq = [random.Random(0).randrange(cfg.vocab_size) for _ in range(40)]
    assert torch.equal(m.prefill(seq), m2.prefill(seq))
    m2.save(tmp_path / "again.safetensors")
    assert path.read_bytes() == (tmp_path / "again.safetensors").read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_load_rejects_foreign_file(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(2)}, str(path), metadata={"format": "other"})
    with pytest.raises(RefModelError, match="format must be"):
        RefModel.load(path)


def test_load_rejects_wrong_shape(tmp_path):
    cfg = RefModelConfig(d_model=32, n_heads=2, max_seq_len=64)
    w = W.generate(cfg)
    w["lm_head"] = w["lm_head"][:, :10].contiguous()
    path = tmp_path / "bad.safetensors"
    W.save(path, cfg, w)
    with pytest.raises(RefModelError, match="lm_head must be int64"):
        RefModel.load(path)


def test_constructor_rejects_wrong_weights():
    cfg = RefModelConfig(d_model=32, n_heads=2, max_seq_len=64)
    w = W.generate(cfg)
    w["tok_emb"] = w["tok_emb"].to(torch.float32)
    with pytest.raises(RefModelError, match=r"weights\['tok_emb'\] must be int64"):
        RefModel(cfg, w)
