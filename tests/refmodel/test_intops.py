"""Integer kernels: exact (== a Python big-int reference) and independent of the batch.

Bug pinned: a kernel that rounds (float accumulation) or lets padding/neighbours leak into
a row, which would make prefill and decode logits differ.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from detsample.refmodel import RefModelConfig, intops
from detsample.refmodel.config import ACT_FRAC, ACT_MAX, GAIN_FRAC, NORM_EPS, W_FRAC


def rand_ints(rng: random.Random, shape, lo, hi) -> torch.Tensor:
    return torch.tensor([rng.randint(lo, hi) for _ in range(math.prod(shape))], dtype=torch.int64).view(shape)


ROUND_SHIFT = [(5, 1), (-5, 1), (7, 3), (-7, 3), (4, 3), (-4, 3), (12345, 0), (2**40 + 1, 20)]


@pytest.mark.parametrize("x,bits", ROUND_SHIFT)
def test_round_shift(x, bits):
    expect = math.floor(x / 2**bits + 0.5) if bits else x
    assert int(intops.round_shift(torch.tensor(x), bits)) == expect


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 9, 33])
def test_linear_exact_against_python_ints(rows):
    rng = random.Random(rows)
    x = rand_ints(rng, (rows, 64), -3000, 3000)
    w = rand_ints(rng, (64, 40), -400, 400)
    got = intops.linear(x, w, W_FRAC)
    xs, ws = x.tolist(), w.tolist()
    for i in range(rows):
        for j in range(40):
            acc = sum(xs[i][k] * ws[k][j] for k in range(64))
            expect = max(-ACT_MAX, min(ACT_MAX, (acc + 2 ** (W_FRAC - 1)) >> W_FRAC))
            assert int(got[i, j]) == expect


def test_rms_norm_matches_formula_and_is_row_local():
    rng = random.Random(0)
    x = rand_ints(rng, (5, 64), -2000, 2000)
    g = rand_ints(rng, (64,), 200, 300)
    got = intops.rms_norm(x, g)
    for i in range(5):
        row = x[i].tolist()
        r = math.sqrt(sum(v * v for v in row) / 64 + NORM_EPS)
        for j in (0, 17, 63):
            y = round(row[j] / r * 2**ACT_FRAC)  # Python round is half-even like torch
            assert int(got[i, j]) == (y * int(g[j]) + 2 ** (GAIN_FRAC - 1)) >> GAIN_FRAC
        assert torch.equal(intops.rms_norm(x[i : i + 1], g)[0], got[i])


def test_attention_padding_and_batch_invariance():
    """A query's output is the same alone, with padded keys, and next to other rows."""
    cfg = RefModelConfig()
    table = intops.exp_table(cfg.exp_table_len, cfg.att_step)
    rng = random.Random(1)
    H, D = 4, 16
    q = rand_ints(rng, (1, H, 1, D), -3000, 3000)
    k = rand_ints(rng, (1, H, 10, D), -3000, 3000)
    v = rand_ints(rng, (1, H, 10, D), -3000, 3000)
    alone = intops.attention(q, k, v, torch.ones(1, 1, 1, 10, dtype=torch.bool), table)
    pad = 7
    kp = torch.cat([k, rand_ints(rng, (1, H, pad, D), -9000, 9000)], dim=2)
    vp = torch.cat([v, rand_ints(rng, (1, H, pad, D), -9000, 9000)], dim=2)
    mask = torch.zeros(1, 1, 1, 10 + pad, dtype=torch.bool)
    mask[..., :10] = True
    padded = intops.attention(q, kp, vp, mask, table)
    assert torch.equal(alone, padded)
    qb = torch.cat([rand_ints(rng, (3, H, 1, D), -3000, 3000), q])
    kb = torch.cat([rand_ints(rng, (3, H, 17, D), -3000, 3000), kp])
    vb = torch.cat([rand_ints(rng, (3, H, 17, D), -3000, 3000), vp])
    maskb = torch.cat([torch.ones(3, 1, 1, 17, dtype=torch.bool), mask])
    assert torch.equal(intops.attention(qb, kb, vb, maskb, table)[3:], alone)


def test_attention_weights_follow_softmax():
    """Integer attention ~ float softmax attention (table step 1/256): loose sanity bound."""
    cfg = RefModelConfig()
    table = intops.exp_table(cfg.exp_table_len, cfg.att_step)
    rng = random.Random(2)
    q = rand_ints(rng, (1, 1, 1, 16), -600, 600)
    k = rand_ints(rng, (1, 1, 12, 16), -600, 600)
    v = rand_ints(rng, (1, 1, 12, 16), -3000, 3000)
    got = intops.attention(q, k, v, torch.ones(1, 1, 1, 12, dtype=torch.bool), table)
    s = (q.double() @ k.double().transpose(-1, -2)) / 2 ** (2 * ACT_FRAC) / 4.0
    ref = torch.softmax(s, -1) @ v.double()
    assert (got.double() - ref).abs().max() < 0.02 * v.abs().max()
