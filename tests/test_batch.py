"""SamplingBatch: row-aligned tensors follow the rows; flags are exact; bad ids fail."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample import InvalidSamplingParams, Request, Sampler, SamplingBatch, SamplingParams
from tests.helpers import params_strategy, requests_from

V = 50


def _expected(p: SamplingParams):
    return (0.0 if p.is_greedy else float(torch.tensor(p.temperature, dtype=torch.float32)),
            V if p.top_k == -1 else min(p.top_k, V), p.top_p,
            float(torch.tensor(p.min_p, dtype=torch.float32)), p.seed, p.is_greedy)


def _rows(b: SamplingBatch):
    return [(float(b.temperatures[i, 0]), int(b.top_ks[i]), float(b.top_ps[i]),
             float(b.min_ps[i]), int(b.seeds[i]), bool(b.greedy[i])) for i in range(len(b))]


def test_tensors_shapes_dtypes():
    b = SamplingBatch.from_requests(requests_from([SamplingParams(top_k=3), SamplingParams()]), V)
    assert b.temperatures.shape == (2, 1) and b.temperatures.dtype == torch.float32
    assert b.top_ks.dtype == torch.int32 and b.seeds.dtype == torch.int64
    assert len(b) == 2


@given(st.lists(params_strategy(V), min_size=1, max_size=8),
       st.lists(params_strategy(V), min_size=0, max_size=5), st.randoms())
def test_filter_merge_keep_rows_aligned(ps, qs, rnd):
    """Every row tensor follows its request through permuting filters and merges (the
    'request A sampled with request B's temperature' class of bug)."""
    b = SamplingBatch.from_requests(requests_from(ps, "a"), V)
    b.merge(SamplingBatch.from_requests(requests_from(qs, "b"), V))
    keep = list(range(len(b)))
    rnd.shuffle(keep)
    keep = keep[: rnd.randint(0, len(keep))]
    b.filter(keep)
    assert _rows(b) == [_expected(r.params) for r in b.requests]
    sampling = [r.params for r in b.requests if not r.params.is_greedy]
    assert b.is_all_greedy == (not sampling)
    assert b.need_top_p == any(p.top_p != 1.0 for p in sampling)
    assert b.need_min_p == any(p.min_p != 0.0 for p in sampling)
    ks = [p.top_k for p in sampling]
    if ks and all(k != -1 for k in ks):
        assert b.max_top_k == max(min(k, V) for k in ks)
        assert all(min(k, V) <= b.max_top_k for k in ks)
    else:
        assert b.max_top_k is None


BAD_IDS = [
    (dict(prompt_ids=[1, V]), "prompt_ids"),
    (dict(output_ids=[V + 3]), "output_ids"),
    (dict(params=SamplingParams(stop_token_ids=[V])), "stop_token_ids"),
    (dict(params=SamplingParams(logit_bias={V: 1.0})), "logit_bias"),
    (dict(params=SamplingParams(allowed_token_ids=[0, V])), "allowed_token_ids"),
    (dict(params=SamplingParams(logprobs=V + 1)), "logprobs"),
]


@pytest.mark.parametrize("kw,field", BAD_IDS)
def test_ids_outside_vocab_rejected_at_build(kw, field):
    with pytest.raises(InvalidSamplingParams, match=field):
        SamplingBatch.from_requests([Request("x", **kw)], V)


def test_bias_is_sparse():
    """No (B, V) tensor exists for logit bias; entries are unique (row, col) pairs."""
    b = SamplingBatch.from_requests(requests_from([SamplingParams(),
                                                   SamplingParams(logit_bias={"3": 1.0, 7: 2.0})]), V)
    rows, cols, vals = b.logit_bias_coo()
    assert rows.tolist() == [1, 1] and cols.tolist() == [3, 7] and vals.tolist() == [1.0, 2.0]
    b.filter([1, 0])
    assert b.logit_bias_coo()[0].tolist() == [0, 0]
    assert SamplingBatch.from_requests(requests_from([SamplingParams()]), V).logit_bias_coo() is None


FILTER_ERRORS = [([0, 0], "distinct"), ([5], "out of range"), ([-1], "out of range"),
                 # regression: floats and bools were truncated by int() (1.7 kept row 1)
                 ([1.7, 0.2], "filter indices must be integers, got 1.7"),
                 (torch.tensor([1.0, 0.0]), "filter indices must be integers, got 1.0"),
                 ([True], "filter indices must be integers, got True")]


@pytest.mark.parametrize("keep,msg", FILTER_ERRORS)
def test_filter_errors(keep, msg):
    b = SamplingBatch.from_requests(requests_from([SamplingParams()] * 2), V)
    with pytest.raises(InvalidSamplingParams, match=msg):
        b.filter(keep)


ADVANCE_NON_INTEGERS = [([3.7, 1.0], "got 3.7"), (torch.tensor([2.5, 1.0]), "got 2.5"),
                        ([True, False], "got True")]


@pytest.mark.parametrize("tokens,msg", ADVANCE_NON_INTEGERS)
def test_advance_rejects_non_integer_tokens_without_change(tokens, msg):
    """Bug pinned: advance truncated float token ids with int() (3.7 recorded token 3)
    and took True/False for tokens 1/0."""
    b = SamplingBatch.from_requests(requests_from([SamplingParams(presence_penalty=1.0)] * 2), V)
    with pytest.raises(InvalidSamplingParams, match=f"advance: token_ids must be integers, {msg}"):
        b.advance(tokens)
    assert b.output_ids == [[], []] and b.penalties.rows[0].snapshot() == {}


def test_merge_errors():
    a = SamplingBatch.from_requests(requests_from([SamplingParams()]), V)
    with pytest.raises(InvalidSamplingParams, match="vocab_size"):
        a.merge(SamplingBatch.from_requests(requests_from([SamplingParams()]), V + 1))
    with pytest.raises(InvalidSamplingParams, match="itself"):
        a.merge(a)


def test_merged_rows_keep_their_own_eos_token_ids():
    """Bug pinned: eos_token_ids (the ids min_new_tokens blocks) were batch-level, and
    merge silently gave the merged rows this batch's EOS ids: a greedy row with
    min_new_tokens built with eos (5,) picked token 5 once merged into an eos (0,) batch.
    Each row keeps the EOS ids of the batch it was built in, through merge and filter."""
    p = SamplingParams(seed=1, temperature=0.0, min_new_tokens=3)
    x = torch.zeros(2, V)
    x[:, 5] = 9.0
    x[:, 0] = 8.0
    five = SamplingBatch.from_requests(requests_from([p]), V, eos_token_ids=(5,))
    zero = SamplingBatch.from_requests(requests_from([p]), V, eos_token_ids=(0,))
    assert int(Sampler().sample(x[:1], five, torch.tensor([0])).token_ids) == 0
    assert int(Sampler().sample(x[:1], zero, torch.tensor([0])).token_ids) == 5
    zero.merge(five)
    assert zero.eos_token_ids == (0,)
    assert Sampler().sample(x, zero, torch.tensor([0, 0])).token_ids.tolist() == [5, 0]
    zero.filter([1, 0])
    assert Sampler().sample(x, zero, torch.tensor([0, 0])).token_ids.tolist() == [0, 5]


def test_advance_records_tokens_and_no_valid_token():
    b = SamplingBatch.from_requests(requests_from([SamplingParams()] * 2), V)
    b.advance(torch.tensor([4, -1]))
    assert b.output_ids == [[4], []] and b.finished == [None, "no_valid_token"]
    with pytest.raises(InvalidSamplingParams, match="outside"):
        b.advance([V, 0])
    with pytest.raises(InvalidSamplingParams, match="entries"):
        b.advance([1])
