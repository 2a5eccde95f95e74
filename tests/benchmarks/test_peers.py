"""detsample/benchmarks/peers.py: the peers' algorithms re-created for the bench are
faithful enough to compare against (their hash, their filters, their draws)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from detsample import SamplingParams
from detsample.benchmarks import peers

M32 = 0xFFFFFFFF
ALPHA = 1e-3  # chi-square significance level (fixed seeds: reproducible)


def _rotl(x, r):
    return ((x << r) | (x >> (32 - r))) & M32


def _mix(h, k):
    k = _rotl((k * 0xCC9E2D51) & M32, 15)
    k = (k * 0x1B873593) & M32
    h = _rotl(h ^ k, 13)
    return (h * 5 + 0xE6546B64) & M32


def murmur_reference(seed: int, pos: int, col: int) -> int:
    """MurmurHash3 (x86, 32-bit) of the 16 bytes seed-low, seed-high, position, column."""
    h = 0
    for k in (seed & M32, seed >> 32, pos & M32, col):
        h = _mix(h, k)
    h ^= 16
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def test_murmur_hash_matches_a_scalar_reference():
    seeds = torch.tensor([0, 1, 2**40 + 7, 2**63 - 1])
    pos = torch.tensor([0, 5, 123456, 2**31])
    got = peers.murmur_hash32(seeds, pos, 9)
    want = [[murmur_reference(int(s), int(p), c) for c in range(9)] for s, p in zip(seeds, pos)]
    assert got.tolist() == want


def _batch(B, V, **kw):
    ps = [SamplingParams(seed=i, **kw) for i in range(B)]
    return peers.PeerBatch.of(ps, torch.arange(B), V)


PEERS = [peers.sglang_deterministic, peers.sglang_shortcut, peers.vllm_seeded, peers.vllm_unseeded]
CONFIGS = [
    dict(temperature=0.8),
    dict(temperature=0.8, top_k=3),
    dict(temperature=0.8, top_p=0.6),
    dict(temperature=0.8, min_p=0.3),
    dict(temperature=0.8, top_k=4, top_p=0.9),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("fn", PEERS, ids=lambda f: f.__name__)
def test_peers_sample_inside_the_filtered_set(fn, cfg):
    """Every peer keeps to the same kept set as detsample's reference semantics on
    well-separated logits, and returns the chosen token's logprob."""
    x = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0]] * 16)
    b = _batch(16, 8, **cfg)
    tok, lp = fn(x, b)
    kept = {"top_k": cfg.get("top_k", 8)}
    z = x[0] / 0.8
    p = torch.softmax(z, -1)
    allowed = set(range(kept["top_k"]))
    if "top_p" in cfg:
        allowed &= {i for i in range(8) if float(p[:i].sum()) < cfg["top_p"]}
    if "min_p" in cfg:
        allowed &= {i for i in range(8) if float(p[i]) >= cfg["min_p"] * float(p[0])}
    assert set(tok.tolist()) <= allowed and lp.shape == (16,) and bool(torch.isfinite(lp).all())


def test_seeded_peers_are_reproducible_and_greedy_is_argmax():
    x = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    for fn in (peers.sglang_deterministic, peers.vllm_seeded):
        a, _ = fn(x, _batch(6, 50, temperature=0.9, top_p=0.9))
        b, _ = fn(x, _batch(6, 50, temperature=0.9, top_p=0.9))  # fresh generators
        assert torch.equal(a, b)
    tok, lp = peers.greedy(x, _batch(6, 50, temperature=0.0))
    assert torch.equal(tok, x.argmax(-1))
    assert torch.equal(lp, torch.log_softmax(x, -1).gather(1, tok[:, None]).squeeze(1))


@pytest.mark.parametrize("fn", [peers.sglang_deterministic, peers.vllm_seeded], ids=lambda f: f.__name__)
def test_seeded_peer_draws_follow_the_softmax(fn):
    """Chi-square goodness of fit (alpha = 1e-3) of 4000 seeded draws of one row."""
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0])
    n = 4000
    ps = [SamplingParams(seed=i, temperature=1.0) for i in range(n)]
    b = peers.PeerBatch.of(ps, torch.arange(n), 5)
    tok, _ = fn(logits.expand(n, 5).contiguous(), b)
    counts = np.bincount(tok.numpy(), minlength=5)
    expected = torch.softmax(logits, -1).numpy() * n
    assert chisquare(counts, expected).pvalue > ALPHA
