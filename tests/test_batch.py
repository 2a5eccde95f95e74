"""SamplingBatch: row-aligned tensors follow the rows; derived summaries are exact; bad ids fail."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample import InvalidSamplingParams, Request, Sampler, SamplingBatch, SamplingParams
from tests.helpers import params_strategy, requests_from

V = 50


def _expected(p: SamplingParams):
    return (
        0.0 if p.is_greedy else float(torch.tensor(p.temperature, dtype=torch.float32)),
        V if p.top_k == -1 else min(p.top_k, V),
        p.top_p,
        float(torch.tensor(p.min_p, dtype=torch.float32)),
        p.seed,
        p.is_greedy,
    )


def _rows(b: SamplingBatch):
    return [
        (
            float(b.temperatures[i, 0]),
            int(b.top_ks[i]),
            float(b.top_ps[i]),
            float(b.min_ps[i]),
            int(b.seeds[i]),
            bool(b.greedy[i]),
        )
        for i in range(len(b))
    ]


def test_tensors_shapes_dtypes():
    b = SamplingBatch.from_requests(requests_from([SamplingParams(top_k=3), SamplingParams()]), V)
    assert b.temperatures.shape == (2, 1) and b.temperatures.dtype == torch.float32
    assert b.top_ks.dtype == torch.int32 and b.seeds.dtype == torch.int64
    assert b.element_filters.shape == (2, 1) and b.element_filters.dtype == torch.float32
    assert len(b) == 2


@given(
    st.lists(params_strategy(V), min_size=1, max_size=8),
    st.lists(params_strategy(V), min_size=0, max_size=5),
    st.randoms(),
)
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
    assert b.is_all_greedy == (not sampling)  # re-derived after filter and merge


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
    b = SamplingBatch.from_requests(requests_from([SamplingParams(), SamplingParams(logit_bias={"3": 1.0, 7: 2.0})]), V)
    rows, cols, vals = b.logit_bias_coo()
    assert rows.tolist() == [1, 1] and cols.tolist() == [3, 7] and vals.tolist() == [1.0, 2.0]
    b.filter([1, 0])
    assert b.logit_bias_coo()[0].tolist() == [0, 0]
    assert SamplingBatch.from_requests(requests_from([SamplingParams()]), V).logit_bias_coo() is None


FILTER_ERRORS = [
    ([0, 0], "distinct"),
    ([5], "out of range"),
    ([-1], "out of range"),
    # regression: floats and bools were truncated by int() (1.7 kept row 1)
    ([1.7, 0.2], "filter indices must be integers, got 1.7"),
    (torch.tensor([1.0, 0.0]), "filter indices must be integers, got 1.0"),
    ([True], "filter indices must be integers, got True"),
]


@pytest.mark.parametrize("keep,msg", FILTER_ERRORS)
def test_filter_errors(keep, msg):
    b = SamplingBatch.from_requests(requests_from([SamplingParams()] * 2), V)
    with pytest.raises(InvalidSamplingParams, match=msg):
        b.filter(keep)


ADVANCE_NON_INTEGERS = [([3.7, 1.0], "got 3.7"), (torch.tensor([2.5, 1.0]), "got 2.5"), ([True, False], "got True")]


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


FLOAT32_OVERFLOW = [
    (SamplingParams(temperature=1e-50), "temperature", "1e-50"),
    (SamplingParams(temperature=1e-46), "temperature", "1e-46"),
    (SamplingParams(temperature=1e39), "temperature", "1e+39"),
    (SamplingParams(logit_bias={3: 1e39}), "logit_bias", "1e+39"),
    (SamplingParams(logit_bias={"4": -1e300}), "logit_bias", "-1e+300"),
]


@pytest.mark.parametrize("p,field,value", FLOAT32_OVERFLOW)
def test_values_that_leave_float32_rejected_at_build(p, field, value):
    """Bug: a temperature that rounds to 0 (1e-50) or inf (1e39) in float32 crashed the
    draw (index out of bounds) or gave NaN scaled logits and a positive "processed"
    logprob; a logit_bias of 1e39 became +inf in float32, and ``-inf + inf = NaN`` was
    then "sanitised" into a finite logit, unmasking a token that min_new_tokens, a
    grammar or allowed_token_ids had set to -inf. Both are now rejected at batch build,
    naming the field and the value (like the penalties)."""
    with pytest.raises(InvalidSamplingParams, match=field) as e:
        SamplingBatch.from_requests([Request("x", p)], V)
    assert value in str(e.value)


def test_extreme_but_float32_representable_values_accepted():
    """The float32 check rejects only values that round to 0 / inf: a subnormal
    temperature and a bias of 3e38 stay valid."""
    ps = [
        SamplingParams(temperature=1e-40),
        SamplingParams(temperature=3e38),
        SamplingParams(logit_bias={1: 3e38, 2: -3e38}),
        SamplingParams(temperature=1e-50, top_k=1),
    ]  # greedy: T is never used
    assert len(SamplingBatch.from_requests(requests_from(ps), V)) == 4


DEVICE_SPELLINGS = ["cpu", "cpu:0", torch.device("cpu", 0)]


@pytest.mark.parametrize("device", DEVICE_SPELLINGS)
def test_device_spelling_normalised(device):
    """Bug: the batch kept ``torch.device(device)`` verbatim, so ``device="cpu:0"`` (and on
    a GPU the usual ``device="cuda"``, whose tensors report cuda:0) made every
    ``Sampler.sample`` fail its logits-device check and ``merge`` refuse a batch built
    with ``"cpu"``. The batch now stores the device its tensors report."""
    from detsample import Sampler

    b = SamplingBatch.from_requests([Request("a", SamplingParams(seed=1))], V, device=device)
    assert b.device == torch.zeros(1).device
    out = Sampler().sample(torch.zeros(1, V), b, torch.tensor([0]))
    assert 0 <= int(out.token_ids[0]) < V
    b.merge(SamplingBatch.from_requests([Request("b")], V, device="cpu"))
    assert len(b) == 2


BUILD_ARG_ERRORS = [
    (dict(eos_token_ids=5), "eos_token_ids"),
    (dict(eos_token_ids=(1.5,)), "eos_token_ids"),  # was silently truncated to 1
    (dict(eos_token_ids=(True,)), "eos_token_ids"),
    (dict(eos_token_ids=(V,)), "eos_token_ids"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(vocab_size=2.0), "vocab_size"),
]


@pytest.mark.parametrize("kw,field", BUILD_ARG_ERRORS)
def test_bad_build_arguments_named(kw, field):
    """Bug: ``eos_token_ids=5`` raised a bare TypeError and ``eos_token_ids=(1.5,)`` was
    silently truncated to token 1; every bad argument of from_requests now raises
    InvalidSamplingParams naming the argument."""
    args = dict(vocab_size=V)
    args.update(kw)
    with pytest.raises(InvalidSamplingParams, match=field):
        SamplingBatch.from_requests([Request("a")], **args)


def test_integer_like_build_arguments_accepted():
    """numpy integers (``logits.shape`` of an array, ids from numpy) are integers; None
    eos ids mean none."""
    import numpy as np

    b = SamplingBatch.from_requests([Request("a")], vocab_size=np.int64(V), eos_token_ids=np.array([0, 3]))
    assert b.vocab_size == V and isinstance(b.vocab_size, int) and b.eos_token_ids == (0, 3)
    assert SamplingBatch.from_requests([], vocab_size=V, eos_token_ids=None).eos_token_ids == ()
