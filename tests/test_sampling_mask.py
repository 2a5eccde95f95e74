"""Sampler.sampling_mask: the kept support of each row beside the token.

Bugs pinned: a mask that is not the set the draw used (the drawn token outside it, or a
token with a finite "processed" logprob missing from it), a greedy row reporting its
filters' set instead of its one token, a row without an admissible token reporting
tokens, a mask that depends on the row's neighbours, and a bitmask in another bit order
than the grammar masks' (xgrammar's).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample import Request, Sampler, SamplingBatch, SamplingParams
from detsample.ops.mask import pack_bitmask, unpack_bitmask
from tests.helpers import logits_rows, params_strategy

V = 64


@given(
    params=st.lists(params_strategy(V), min_size=1, max_size=5),
    family=st.sampled_from(["random", "ties", "peaked", "neginf", "onehot"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_mask_is_the_support_of_the_draw_and_batch_invariant(params, family, seed):
    reqs = [Request(f"r{i}", p.replace(logprobs_mode="processed", logprobs=0), [1, 2]) for i, p in enumerate(params)]
    logits = torch.from_numpy(logits_rows(np.random.default_rng(seed), len(reqs), V, family))
    batch = SamplingBatch.from_requests(reqs, V)
    sampler = Sampler()
    pos = torch.arange(len(reqs)) + 3
    out, mask = sampler.sample_with_mask(logits, batch, pos)
    for i, r in enumerate(reqs):
        t = int(out.token_ids[i])
        assert (t == -1) == (not bool(mask[i].any()))
        if t >= 0:
            assert bool(mask[i, t])
        alone = SamplingBatch.from_requests([r], V)
        assert torch.equal(sampler.sampling_mask(logits[i : i + 1].clone(), alone), mask[i : i + 1])
        if not r.params.is_greedy:  # finite processed logprob <=> in the support
            lps = torch.stack(
                [sampler.compute_logprobs(logits[i : i + 1].clone(), alone, torch.tensor([v])) for v in range(V)]
            )
            assert torch.equal(torch.isfinite(lps[:, 0]), mask[i])


def test_greedy_and_dead_rows():
    reqs = [
        Request("g", SamplingParams(temperature=0.0, seed=1), [1]),
        Request("dead", SamplingParams(seed=2, allowed_token_ids=(5,)), [1]),
        Request("k2", SamplingParams(seed=3, top_k=2), [1]),
    ]
    logits = torch.arange(V, dtype=torch.float32).repeat(3, 1)
    logits[1, 5] = float("-inf")
    mask = Sampler().sampling_mask(logits, SamplingBatch.from_requests(reqs, V))
    assert mask[0].nonzero().flatten().tolist() == [V - 1]
    assert not bool(mask[1].any())
    assert mask[2].nonzero().flatten().tolist() == [V - 2, V - 1]


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 64, 100])
def test_bitmask_is_the_grammar_masks_layout(vocab):
    keep = torch.from_numpy(np.random.default_rng(vocab).random((3, vocab)) < 0.5)
    words = pack_bitmask(keep)
    assert words.dtype == torch.int32 and words.shape == (3, (vocab + 31) // 32)
    assert torch.equal(unpack_bitmask(words, vocab), keep)
    one = torch.zeros((1, vocab), dtype=torch.bool)
    one[0, vocab - 1] = True
    w = pack_bitmask(one)
    assert int(w[0, (vocab - 1) // 32]) & 0xFFFFFFFF == 1 << ((vocab - 1) % 32)


def test_sampling_mask_as_bitmask_unpacks_to_the_bool_mask():
    reqs = [Request(f"r{i}", SamplingParams(seed=i, top_p=0.5), [1]) for i in range(2)]
    batch = SamplingBatch.from_requests(reqs, V)
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(0))
    s = Sampler()
    assert torch.equal(unpack_bitmask(s.sampling_mask(logits, batch, bitmask=True), V), s.sampling_mask(logits, batch))


def test_a_rows_neginf_logits_are_never_in_its_support():
    """A sampling row without a filter has threshold -inf, so ``z >= tau`` kept its -inf
    logits: the mask said every token of the row could be drawn, though those hold no
    mass and their processed logprob is -inf."""
    logits = torch.arange(V, dtype=torch.float32).repeat(2, 1)
    logits[:, ::3] = float("-inf")
    reqs = [Request(f"r{i}", SamplingParams(temperature=t, seed=i), [1]) for i, t in enumerate((0.3, 1.0))]
    mask = Sampler().sampling_mask(logits, SamplingBatch.from_requests(reqs, V))
    assert torch.equal(mask, torch.isfinite(logits))
