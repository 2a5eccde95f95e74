"""SamplingParams / Request validation: every rule names the field and the value."""

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from detsample import InvalidSamplingParams, Request, SamplingParams

BAD = [
    (dict(temperature=-0.1), "temperature", "-0.1"),
    (dict(temperature=float("nan")), "temperature", "nan"),
    (dict(temperature=float("inf")), "temperature", "inf"),
    (dict(top_k=0), "top_k", "0"),
    (dict(top_k=-2), "top_k", "-2"),
    (dict(top_k=2.5), "top_k", "2.5"),
    (dict(top_p=0.0), "top_p", "0.0"),
    (dict(top_p=1.5), "top_p", "1.5"),
    (dict(top_p=float("nan")), "top_p", "nan"),
    (dict(min_p=-0.1), "min_p", "-0.1"),
    (dict(min_p=1.01), "min_p", "1.01"),
    (dict(repetition_penalty=0.0), "repetition_penalty", "0.0"),
    (dict(repetition_penalty=-1.0), "repetition_penalty", "-1.0"),
    (dict(frequency_penalty=float("inf")), "frequency_penalty", "inf"),
    (dict(presence_penalty=float("nan")), "presence_penalty", "nan"),
    (dict(min_new_tokens=-1), "min_new_tokens", "-1"),
    (dict(logprobs=-1), "logprobs", "-1"),
    (dict(logprobs_mode="log"), "logprobs_mode", "log"),
    (dict(logit_bias={"x": 1.0}), "logit_bias", "x"),
    (dict(logit_bias={1.5: 1.0}), "logit_bias", "1.5"),
    (dict(logit_bias={"1": 1.0, "01": 2.0}), "logit_bias", "01"),
    (dict(logit_bias={3: float("nan")}), "logit_bias", "nan"),
    (dict(seed=-1), "seed", "-1"),
    (dict(seed=2**63), "seed", str(2**63)),
    (dict(stop_token_ids=[-3]), "stop_token_ids", "-3"),
    (dict(regex="a", ebnf='root ::= "a"'), "at most one", "regex"),
]


@pytest.mark.parametrize("kwargs,field,value", BAD)
def test_bad_params_name_field_and_value(kwargs, field, value):
    with pytest.raises(InvalidSamplingParams) as ei:
        SamplingParams(**kwargs)
    assert field in str(ei.value) and value in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_logit_bias_string_keys_accepted_and_deduplicated():
    """JSON keys are strings: "42" is token 42; "1" and "01" colliding is an error,
    not a silent overwrite (SGLang's nondeterministic duplicate index_put story)."""
    p = SamplingParams(logit_bias={"42": 1.0, 7: -2.0})
    assert p.logit_bias == ((7, -2.0), (42, 1.0))


def test_unseeded_requests_get_distinct_replayable_seeds():
    """Unseeded requests must not share a default seed; the seed is reported back."""
    seeds = {SamplingParams().seed for _ in range(64)}
    assert len(seeds) == 64
    assert all(isinstance(s, int) and 0 <= s < 2**63 for s in seeds)
    p = SamplingParams(temperature=0.5)
    assert p.replace(top_k=3).seed == p.seed


def test_greedy_definition():
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(top_k=1, temperature=0.7).is_greedy
    assert not SamplingParams(temperature=0.7).is_greedy


def test_request_validates_ids():
    with pytest.raises(InvalidSamplingParams, match="prompt_ids"):
        Request("a", SamplingParams(), prompt_ids=[1, -2])


def test_finite_floats_are_accepted():
    p = SamplingParams(temperature=2, frequency_penalty=-1.5, presence_penalty=2.0)
    assert p.temperature == 2.0 and not math.isnan(p.frequency_penalty)


def test_replace_keeps_logit_bias():
    """Bug pinned: replace() re-validated the stored (id, bias) tuple form and rejected
    it ("logit_bias must be a mapping ... got tuple")."""
    p = SamplingParams(logit_bias={"5": 1.0, 2: -1.0}, seed=3)
    q = p.replace(temperature=0.5)
    assert q.logit_bias == p.logit_bias and q.seed == 3


ROUND_TRIP_FIELDS = dict(  # one strategy per field, every field of SamplingParams
    temperature=st.floats(0, 4),
    top_k=st.sampled_from([-1, 1, 7]),
    top_p=st.sampled_from([1.0, 0.5]),
    min_p=st.sampled_from([0.0, 0.1]),
    repetition_penalty=st.sampled_from([1.0, 1.3]),
    frequency_penalty=st.floats(-2, 2),
    presence_penalty=st.floats(-2, 2),
    min_new_tokens=st.integers(0, 5),
    stop_token_ids=st.lists(st.integers(0, 50), max_size=3),
    logit_bias=st.one_of(
        st.none(),
        st.dictionaries(
            st.one_of(st.integers(0, 50), st.integers(0, 50).map(str)), st.floats(-5, 5), max_size=4
        ).filter(lambda d: len({int(k) for k in d}) == len(d)),
    ),
    seed=st.one_of(st.none(), st.integers(0, 2**63 - 1)),
    logprobs=st.integers(0, 3),
    logprobs_mode=st.sampled_from(["raw", "scaled", "processed"]),
    json_schema=st.sampled_from([None, {"type": "object"}]),
    max_new_tokens=st.one_of(st.none(), st.integers(1, 9)),
    allowed_token_ids=st.one_of(st.none(), st.lists(st.integers(0, 50), min_size=1, max_size=4)),
    bad_words=st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=3), max_size=2),
    logits_processor=st.sampled_from([None, abs]),
    extra_args=st.one_of(st.none(), st.dictionaries(st.text(max_size=4), st.integers(), max_size=3)),
    require_reasoning=st.booleans(),
)


def test_round_trip_strategies_cover_every_field():
    assert set(ROUND_TRIP_FIELDS) | {"regex", "ebnf", "structural_tag"} == {
        f.name for f in dataclasses.fields(SamplingParams)
    }


@given(st.fixed_dictionaries(ROUND_TRIP_FIELDS), st.sampled_from(sorted(ROUND_TRIP_FIELDS)))
def test_replace_and_asdict_round_trip_every_field(kw, changed):
    """Bug pinned: ``replace`` / ``dataclasses.replace`` re-validated the normalised
    ``logit_bias`` form and rejected it, so callers converted it back to a dict by hand.
    All three copies now give an equal SamplingParams (same seed, same normalised
    logit_bias), and every field's normalised value is accepted back by ``replace``."""
    p = SamplingParams(**kw)
    copies = [p.replace(), dataclasses.replace(p), SamplingParams(**dataclasses.asdict(p))]
    for q in copies:
        assert q == p
        assert q.logit_bias == p.logit_bias and q.seed == p.seed
    q = p.replace(**{changed: getattr(p, changed)})  # each normalised value is accepted back
    assert q == p


SEQUENCE_FIELDS_BAD = [
    (dict(bad_words=1.5), "bad_words", "1.5"),
    (dict(bad_words=[1.5]), "bad_words", "1.5"),
    (dict(bad_words=[[1, "x"]]), "bad_words", "'x'"),
    (dict(stop_token_ids=7), "stop_token_ids", "7"),
    (dict(allowed_token_ids=2.0), "allowed_token_ids", "2.0"),
    (dict(logit_bias=((1, 2.0), (1, 3.0))), "logit_bias", "token 1 twice"),
    (dict(logit_bias=[1, 2]), "logit_bias", "list"),
]


@pytest.mark.parametrize("kwargs,field,value", SEQUENCE_FIELDS_BAD)
def test_bad_sequence_fields_raise_invalid_params_naming_the_field(kwargs, field, value):
    """Bug pinned: ``SamplingParams(bad_words=1.5)`` raised a bare ``TypeError`` ("'float'
    object is not iterable") naming no field."""
    with pytest.raises(InvalidSamplingParams) as ei:
        SamplingParams(**kwargs)
    assert field in str(ei.value) and value in str(ei.value)


UNKNOWN_FIELDS = [  # (keyword, words the error must carry)
    ("n", ["'n'", "child_requests", "seed + j"]),
    ("max_tokens", ["'max_tokens'", "max_new_tokens"]),
    ("temprature", ["'temprature'", "temperature"]),
]


@pytest.mark.parametrize("key,words", UNKNOWN_FIELDS)
def test_unknown_field_is_the_named_error(key, words):
    """Bug pinned: ``SamplingParams(n=4)`` was a bare TypeError from the dataclass, not the
    project's InvalidSamplingParams naming the field (and ``replace`` alike)."""
    for make in (lambda: SamplingParams(**{key: 4}), lambda: SamplingParams().replace(**{key: 4})):
        with pytest.raises(InvalidSamplingParams) as exc:
            make()
        assert all(w in str(exc.value) for w in words), str(exc.value)


@given(st.integers(0, 2**63 - 100), st.integers(1, 16))
def test_child_requests_use_vllm_child_seeds(seed, n):
    """Sample j of a request with seed s has seed s + j (vLLM's parallel sampling), so n
    samples of one prompt are n distinct streams, never n copies of one."""
    from detsample.params import Request, child_requests

    kids = child_requests(Request("q", SamplingParams(seed=seed, top_p=0.9), [1, 2]), n)
    assert [k.seed for k in kids] == [seed + j for j in range(n)]
    assert [k.rid for k in kids] == [f"q/{j}" for j in range(n)]
    assert all(k.params.top_p == 0.9 and k.prompt_ids == [1, 2] for k in kids)


def test_child_seed_out_of_range_is_refused():
    from detsample.params import child_seed

    with pytest.raises(InvalidSamplingParams, match="child seed"):
        child_seed(2**63 - 1, 1)
