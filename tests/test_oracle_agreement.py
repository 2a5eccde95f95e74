"""End-to-end agreement with the numpy oracle (oracles/sampler.py), bit for bit.

The oracle computes detsample's defined arithmetic (oracles/arith.py) on its own, so
every row must agree exactly: the token id, and the logprob's float32 bits -- near-ties
included (both sides decide on the same defined exps).
"""

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample import Sampler, SamplingBatch
from oracles import sampler as osamp
from tests.helpers import logits_rows, params_strategy, requests_from

V = 64


def _row_params(p):
    return osamp.RowParams(
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        min_p=p.min_p,
        logit_bias=dict(p.logit_bias or ()),
        seed=p.seed,
        logprobs_mode=p.logprobs_mode,
    )


def _bits(v) -> int:
    return int(np.array([v], dtype=np.float32).view(np.int32)[0])


@given(
    st.lists(params_strategy(V), min_size=1, max_size=12),
    st.sampled_from(["random", "ties", "neginf", "nan", "onehot"]),
    st.integers(0, 2**32 - 1),
)
def test_sampler_matches_oracle(ps, family, seed):
    rng = np.random.default_rng(seed)
    x = logits_rows(rng, len(ps), V, family)
    pos = rng.integers(0, 10_000, len(ps))
    out = Sampler().sample(
        torch.from_numpy(x), SamplingBatch.from_requests(requests_from(ps), V), torch.from_numpy(pos)
    )
    for i, p in enumerate(ps):
        r = osamp.sample_row(x[i], _row_params(p), int(pos[i]))
        assert int(out.token_ids[i]) == r.token, (i, p)
        assert _bits(out.logprobs[i]) == _bits(r.logprob), (i, p, float(out.logprobs[i]), r.logprob)


def test_near_ties_agree_exactly_too():
    """Before the defined arithmetic, rows whose decision lay within 1e-5 of a threshold
    were skipped (float64 exp against the platform's float32 exp could decide either
    way). Now both compute the same exps: near-tie rows must agree like the others."""
    rng = np.random.default_rng(11)
    from detsample import SamplingParams

    ps = [
        SamplingParams(
            temperature=0.8,
            top_k=20,
            top_p=0.9,
            seed=i,
            logprobs_mode=("raw", "scaled", "processed", "processed_fixed")[i % 4],
        )
        for i in range(40)
    ]
    x = logits_rows(rng, len(ps), V, "random")
    for row in x:  # the 21st largest value one float32 ulp below the 20th: a near-tie
        order = np.argsort(-row, kind="stable")
        row[order[20]] = np.nextafter(row[order[19]], np.float32(-np.inf))
    pos = torch.arange(len(ps))
    out = Sampler().sample(torch.from_numpy(x), SamplingBatch.from_requests(requests_from(ps), V), pos)
    near = 0
    for i, p in enumerate(ps):
        r = osamp.sample_row(x[i], _row_params(p), i)
        near += r.margin <= 1e-5
        assert int(out.token_ids[i]) == r.token and _bits(out.logprobs[i]) == _bits(r.logprob)
    assert near >= 5, near  # the test does reach near-ties


def test_oracle_adds_bias_in_float32_like_the_library():
    """Bug (oracle): the oracle added logit_bias in float64, so on an all-NaN row
    (floored to the lowest float32, -3.4e38) a bias of 1e30 (below half an ulp there)
    made token 0 the clear winner in the oracle while the library's float32 add leaves
    the row uniform; the oracle reported a wide margin, so the agreement test failed
    (hypothesis found it). Step 5 is a float32 add; the oracle now rounds it the same."""
    from detsample import SamplingParams

    x = np.full((1, 8), np.nan, dtype=np.float32)
    p = SamplingParams(temperature=1e-6, logit_bias={0: 1e30}, seed=0)
    batch = SamplingBatch.from_requests(requests_from([p]), 8)
    out = Sampler().sample(torch.from_numpy(x), batch, torch.tensor([0]))
    r = osamp.sample_row(x[0], _row_params(p), 0)
    assert int(out.token_ids[0]) == r.token


def test_a_nan_rows_raw_logprob_is_of_the_sanitised_logits():
    """The oracle took "raw" logprobs of the unsanitised row (NaN for a row holding a
    NaN) where docs/sampling.md and the sampler take them of the sanitised logits (NaN
    -> the lowest float32): an all-NaN greedy row is -log V on both sides."""
    from detsample import SamplingParams

    x = np.full((1, V), np.nan, dtype=np.float32)
    p = SamplingParams(temperature=0.0, seed=0)
    out = Sampler().sample(torch.from_numpy(x), SamplingBatch.from_requests(requests_from([p]), V), torch.tensor([0]))
    r = osamp.sample_row(x[0], _row_params(p), 0)
    assert int(out.token_ids[0]) == r.token == 0
    assert _bits(out.logprobs[0]) == _bits(r.logprob) == _bits(np.float32(-np.log(V)))
