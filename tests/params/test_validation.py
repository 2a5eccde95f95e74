"""detsample/validation.py: one home for every input rule, each error naming field and value."""

from __future__ import annotations

import pytest
import torch

from detsample import InvalidSamplingParams, Request, SamplingBatch, SamplingParams
from detsample.params import validation as val

FIELD_ERRORS = [  # (call, expected message fragment)
    (lambda: val.real_field("top_p", True), "top_p must be a real number, got True"),
    (lambda: val.real_field("top_p", float("nan")), "top_p must be finite, got nan"),
    (lambda: val.int_field("top_k", 3.0), "top_k must be an integer, got 3.0"),
    (lambda: val.id_sequence("stop_token_ids", "12"), "stop_token_ids must be a sequence"),
    (lambda: val.id_sequence("stop_token_ids", [1, -1]), "got -1"),
    (lambda: val.int_list("filter indices", [1, 2.0]), "filter indices must be integers, got 2.0"),
    (lambda: val.int_list("filter indices", 3), "filter indices must be a sequence"),
    (lambda: val.token_id_key("logit_bias", "x"), "logit_bias keys must be integer token ids"),
    (lambda: val.token_id_key("logit_bias", -2), "logit_bias token ids must be >= 0"),
    (lambda: val.sequence_of("bad_words", 1.5), "bad_words must be a sequence, got 1.5"),
]


@pytest.mark.parametrize("call,msg", FIELD_ERRORS)
def test_field_rules_name_field_and_value(call, msg):
    with pytest.raises(InvalidSamplingParams) as ei:
        call()
    assert msg in str(ei.value)


FLOAT32_CASES = [  # (value, nonzero, ok)
    (3e38, False, True),
    (-3e38, False, True),
    (1e39, False, False),
    (-1e300, False, False),
    (1e-40, True, True),
    (1e-50, True, False),
    (0.0, True, True),
    (1e-50, False, True),
]


@pytest.mark.parametrize("v,nonzero,ok", FLOAT32_CASES)
def test_one_float32_range_rule(v, nonzero, ok):
    """The float32 range used to be checked twice (once in torch for temperature and
    bias, once in numpy for the penalties); one rule now serves both."""
    if ok:
        val.float32_finite("", "x", v, nonzero=nonzero)
    else:
        with pytest.raises(InvalidSamplingParams, match="x must be representable in float32"):
            val.float32_finite("", "x", v, nonzero=nonzero)


REQUEST_ERRORS = [
    (dict(temperature=1e-50), [], "temperature"),
    (dict(logit_bias={3: 1e39}), [], "logit_bias[3]"),
    (dict(frequency_penalty=1e39), [], "frequency_penalty"),
    (dict(repetition_penalty=1e-50), [], "repetition_penalty"),
    (dict(stop_token_ids=[40]), [], "stop_token_ids contains token id 40"),
    (dict(bad_words=[[1, 40]]), [], "bad_words contains token id 40"),
    (dict(logprobs=41), [], "logprobs must be <= vocab_size (40)"),
    (dict(logits_processor=7), [], "logits_processor must be callable"),
    (dict(), [1, 99], "prompt_ids contains token id 99"),
]


@pytest.mark.parametrize("kw,prompt,msg", REQUEST_ERRORS)
def test_check_request_is_what_the_batch_build_applies(kw, prompt, msg):
    """One request check for an engine's up-front admission and for the batch build:
    both raise the same message naming the request and the field."""
    r = Request("q", SamplingParams(**kw), prompt_ids=prompt)
    with pytest.raises(InvalidSamplingParams) as direct:
        val.check_request(r, 40)
    with pytest.raises(InvalidSamplingParams) as built:
        SamplingBatch.from_requests([r], 40)
    assert msg in str(direct.value) and str(direct.value) == str(built.value)
    assert str(direct.value).startswith("request 'q': ")


ROW_ID_ERRORS = [
    (torch.tensor([0, 1, 2]), "positions must be an int64 tensor of shape (2,)"),
    (torch.tensor([0.0, 1.0]), "got torch.float32"),
    (torch.tensor([0, -1]), "positions must be >= 0, got -1"),
    ("ab", "positions must be an int64 tensor of shape (2,)"),
]


@pytest.mark.parametrize("t,msg", ROW_ID_ERRORS)
def test_row_ids_tensor_errors(t, msg):
    with pytest.raises(InvalidSamplingParams) as ei:
        val.row_ids_tensor("positions", t, 2, torch.device("cpu"))
    assert msg in str(ei.value)


def test_row_ids_tensor_accepts_int32_and_lists():
    for t in ([3, 4], torch.tensor([3, 4], dtype=torch.int32)):
        out = val.row_ids_tensor("token_ids", t, 2, torch.device("cpu"), upper=5)
        assert out.dtype == torch.int64 and out.tolist() == [3, 4]
    with pytest.raises(InvalidSamplingParams, match=r"token_ids must be < vocab_size \(4\), got 4"):
        val.row_ids_tensor("token_ids", [3, 4], 2, torch.device("cpu"), upper=4)
