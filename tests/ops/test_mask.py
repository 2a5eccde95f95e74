"""Tests of detsample/ops/mask.py against oracles/mask.py (per-row numpy loop)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.ops import mask as mask_ops
from detsample.ops.mask import (
    allocate_token_bitmask,
    apply_token_bitmask_,
    bitmask_width,
    masked_logits,
    unpack_bitmask,
)
from oracles.mask import apply_token_bitmask as oracle_apply

SHAPES = [(1, 1), (2, 31), (3, 32), (4, 33), (5, 512), (2, 1000)]


@pytest.mark.parametrize("b,v", SHAPES)
def test_allocate_all_allowed(b, v):
    bm = allocate_token_bitmask(b, v)
    assert bm.dtype == torch.int32 and bm.shape == (b, (v + 31) // 32)
    assert bool((bm == -1).all())


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 6), v=st.integers(1, 200), seed=st.integers(0, 2**31 - 1), data=st.data())
def test_apply_matches_oracle(b, v, seed, data):
    """Bitwise: allowed logits keep their bits; disallowed are -inf; unlisted rows untouched."""
    rng = np.random.default_rng(seed)
    logits = torch.from_numpy(rng.standard_normal((b, v)).astype(np.float32))
    words = rng.integers(-(2**31), 2**31, size=(b, bitmask_width(v)), dtype=np.int64)
    bm = torch.from_numpy(words.astype(np.int32))
    rows = sorted(data.draw(st.sets(st.integers(0, b - 1))))
    out = apply_token_bitmask_(logits.clone(), bm, rows)
    ref = oracle_apply(logits.numpy(), bm.numpy(), rows)
    assert np.array_equal(out.numpy().astype(np.float64), ref)
    for r in set(range(b)) - set(rows):
        assert torch.equal(out[r], logits[r])


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 5),
    v=st.integers(1, 150),
    cut=st.integers(0, 5),
    limit=st.one_of(st.none(), st.integers(0, 160)),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_narrow_bitmask_and_limit_match_oracle(b, v, cut, limit, seed, data):
    """A bitmask narrower than the logits (padded model vocabulary) disallows the tail."""
    rng = np.random.default_rng(seed)
    w = max(1, bitmask_width(v) - cut)
    logits = torch.from_numpy(rng.standard_normal((b, v)).astype(np.float32))
    bm = torch.from_numpy(rng.integers(-(2**31), 2**31, size=(b, w)).astype(np.int32))
    rows = sorted(data.draw(st.sets(st.integers(0, b - 1))))
    ref = oracle_apply(logits.numpy(), bm.numpy(), rows, limit)
    out = masked_logits(logits, bm, rows, limit)
    assert np.array_equal(out.numpy().astype(np.float64), ref)
    inplace = apply_token_bitmask_(logits.clone(), bm, rows, limit)
    assert torch.equal(inplace, out)


@settings(max_examples=30, deadline=None)
@given(r=st.integers(1, 4), w=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_numpy_and_torch_unpack_agree(r, w, seed):
    """The CPU fast path (numpy.unpackbits) must give the torch path's exact bits."""
    rng = np.random.default_rng(seed)
    bm = torch.from_numpy(rng.integers(-(2**31), 2**31, size=(r, w)).astype(np.int32))
    v = w * 32 - int(rng.integers(0, 32))
    assert torch.equal(unpack_bitmask(bm, v, impl="numpy"), unpack_bitmask(bm, v, impl="torch"))


def test_masked_logits_leaves_input_and_keeps_negative_zero():
    """Bug pinned: an additive mask (x + 0.0) turns -0.0 into +0.0."""
    logits = torch.tensor([[-0.0, 1.0, -0.0, 2.0] + [0.5] * 28])
    before = logits.clone()
    bm = torch.tensor([[0b0101]], dtype=torch.int32)
    out = masked_logits(logits, bm)
    assert torch.equal(logits, before)
    assert torch.signbit(out[0, 0]) and torch.signbit(out[0, 2])
    assert bool(torch.isneginf(out[0, [1, 3]]).all())


def test_apply_sets_exact_neg_inf_not_large_negative():
    """Bug pinned: masking by adding -1e9 changes results for huge logits (a masked
    3e38 logit stays finite); -inf must be exact."""
    logits = torch.full((1, 40), 3.0e38)
    bm = allocate_token_bitmask(1, 40)
    bm[0, 0] = 0b101
    out = apply_token_bitmask_(logits, bm, [0])
    assert out[0, 0] == 3.0e38 and out[0, 2] == 3.0e38
    assert bool(torch.isneginf(out[0, 1])) and bool(torch.isneginf(out[0, 3:32]).all())
    assert bool((out[0, 32:] == 3.0e38).all())


def test_apply_none_means_all_rows_and_empty_rows_noop():
    logits = torch.randn(3, 64)
    bm = torch.zeros(3, 2, dtype=torch.int32)
    assert torch.equal(apply_token_bitmask_(logits.clone(), bm, []), logits)
    assert bool(torch.isneginf(apply_token_bitmask_(logits.clone(), bm, None)).all())


def test_bit_31_is_the_last_token_of_a_word():
    logits = torch.zeros(1, 64)
    bm = torch.zeros(1, 2, dtype=torch.int32)
    bm[0, 0] = -(2**31)  # only bit 31
    out = apply_token_bitmask_(logits, bm, [0])
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [31]


BAD = [
    (torch.zeros(2, 40), torch.zeros(2, 3, dtype=torch.int32), [0], "bitmask must be int32"),
    (torch.zeros(2, 40), torch.zeros(2, 2, dtype=torch.int64), [0], "bitmask must be int32"),
    (torch.zeros(40), torch.zeros(2, 2, dtype=torch.int32), [0], "logits must be 2-D"),
    (torch.zeros(2, 40), torch.zeros(2, 2, dtype=torch.int32), [2], r"rows must be in \[0, 2\)"),
]


@pytest.mark.parametrize("logits,bm,rows,msg", BAD)
def test_apply_rejects_bad_shapes(logits, bm, rows, msg):
    with pytest.raises(ValueError, match=msg):
        apply_token_bitmask_(logits, bm, rows)


SPARSE_CASES = [(1, 64, [0]), (3, 3200, [0, 7, 99]), (2, 320, [])]


@pytest.mark.parametrize("b,v,words", SPARSE_CASES)
def test_word_sparse_path_matches_oracle(b, v, words, monkeypatch):
    """The all-rows path that copies only nonzero 32-token blocks (taken when few words
    are nonzero) must equal the oracle bit for bit, -0.0 included."""
    rng = np.random.default_rng(v)
    logits = torch.from_numpy(rng.standard_normal((b, v)).astype(np.float32))
    logits[0, 0] = -0.0
    bm = torch.zeros((b, v // 32), dtype=torch.int32)
    for w in words:
        bm[:, w] = torch.from_numpy(rng.integers(-(2**31), 2**31, size=b).astype(np.int32))
    bm[0, 0] |= 1
    monkeypatch.setattr(mask_ops, "SPARSE_MAX_FRACTION", 1.0)
    assert mask_ops._masked_sparse(logits, bm) is not None
    out = masked_logits(logits, bm)
    assert np.array_equal(out.numpy().astype(np.float64), oracle_apply(logits.numpy(), bm.numpy()))
    assert torch.signbit(out[0, 0])
