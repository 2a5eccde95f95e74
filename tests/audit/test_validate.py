"""Bad audit input is named (file, line, field) and excluded, or fatal with strict
(detsample/auditvalidate.py, detsample/auditio.py)."""

from __future__ import annotations

import json

import pytest

from detsample.audit import AuditInputError, audit

GOOD = {
    "id": "ok",
    "prompt_ids": [1, 2],
    "response_ids": [3, 4],
    "engine_logprobs": [-0.5, -1.0],
    "trainer_logprobs": [-0.5, -1.0],
    "mask": [1, 1],
}


def _with(**changes):
    rec = dict(GOOD, id="bad")
    for k, v in changes.items():
        if v is _DROP:
            rec.pop(k)
        else:
            rec[k] = v
    return json.dumps(rec)


_DROP = object()

# (name, bad JSONL line, expected kind, expected field, text in the message)
BAD_LINES = [
    ("bad-json", '{"id": "x", "prompt_ids": [1', "bad_json", "<line>", "invalid JSON"),
    ("not-object", "[1, 2, 3]", "bad_type", "<record>", "JSON object"),
    # Bug pinned: "invalid JSON: Unterminated string starting at at column 7"
    ("unterminated", '{"id": "x', "bad_json", "<line>", "invalid JSON: Unterminated string starting at (column 8)"),
    ("missing-id", _with(id=_DROP), "missing_column", "id", "'id'"),
    ("missing-response", _with(response_ids=_DROP), "missing_column", "response_ids", ""),
    ("missing-engine", _with(engine_logprobs=_DROP), "missing_column", "engine_logprobs", ""),
    ("missing-trainer", _with(trainer_logprobs=_DROP), "missing_column", "trainer_logprobs", "rescore"),
    ("engine-count", _with(engine_logprobs=[-0.5]), "count_mismatch", "engine_logprobs", "1 values for 2 response_ids"),
    (
        "trainer-count",
        _with(trainer_logprobs=[-0.5, -1.0, -2.0]),
        "count_mismatch",
        "trainer_logprobs",
        "3 values for 2",
    ),
    ("ragged-mask", _with(mask=[1]), "ragged", "mask", "1 values for 2"),
    ("nested", _with(response_ids=[[3], [4, 5]]), "ragged", "response_ids", "flat"),
    (
        "nan-engine",
        '{"id": "bad", "prompt_ids": [1], "response_ids": [3, 4], '
        '"engine_logprobs": [-0.5, NaN], "trainer_logprobs": [-0.5, -1.0]}',
        "nan",
        "engine_logprobs",
        "engine_logprobs[1] = nan",
    ),
    (
        "nan-trainer",
        '{"id": "bad", "prompt_ids": [1], "response_ids": [3, 4], '
        '"engine_logprobs": [-0.5, -1], "trainer_logprobs": [NaN, -1.0]}',
        "nan",
        "trainer_logprobs",
        "trainer_logprobs[0] = nan",
    ),
    (
        "inf",
        '{"id": "bad", "prompt_ids": [1], "response_ids": [3, 4], '
        '"engine_logprobs": [-0.5, -Infinity], "trainer_logprobs": [-0.5, -1.0]}',
        "non_finite",
        "engine_logprobs",
        "infinite",
    ),
    ("positive", _with(trainer_logprobs=[-0.5, 0.25]), "positive_logprob", "trainer_logprobs", "= 0.25"),
    ("string-logprob", _with(engine_logprobs=["-0.5", -1.0]), "bad_type", "engine_logprobs", "numbers"),
    ("float-token", _with(response_ids=[3.5, 4]), "bad_type", "response_ids", "integers"),
    ("negative-token", _with(response_ids=[3, -4]), "negative_token_id", "response_ids", "-4"),
    ("bad-mask", _with(mask=[1, 2]), "bad_mask", "mask", "mask[1] = 2"),
    ("null-logprob", _with(engine_logprobs=[-0.5, None]), "bad_type", "engine_logprobs", "None"),
    # Bug pinned (found by tests/audit/test_fuzz.py): pyarrow's JSON reader reads
    # a list starting with null, [null, -1.0], as [-1.0, 0.0]; the fast path took it
    ("leading-null", _with(engine_logprobs=[None, -1.0]), "bad_type", "engine_logprobs", "engine_logprobs[0] = None"),
    # Bug pinned: a JSON boolean next to numbers was coerced by numpy (false -> logprob 0.0,
    # true -> token id 1) and audited as if valid.
    (
        "bool-logprob",
        _with(trainer_logprobs=[-0.5, False]),
        "bad_type",
        "trainer_logprobs",
        "trainer_logprobs[1] = False (values must be numbers)",
    ),
    (
        "bool-token",
        _with(response_ids=[True, 4]),
        "bad_type",
        "response_ids",
        "response_ids[0] = True (values must be integers)",
    ),
    # Bugs pinned: token id 2**63 was "got dtype float64" without the value (and
    # accepted as a uint64 in NPZ); a null id was missing_column, where the docs say bad_type
    (
        "big-token",
        _with(response_ids=[3, 2**63]),
        "bad_type",
        "response_ids",
        "response_ids[1] = 9223372036854775808 (out of the int64 range)",
    ),
    (
        "bigger-token",
        _with(response_ids=[2**64, 3]),
        "bad_type",
        "response_ids",
        "response_ids[0] = 18446744073709551616 (out of the int64 range)",
    ),
    ("null-id", _with(id=None), "bad_type", "id", "id is null"),
    ("float-id", _with(id=1.5), "bad_type", "id", "got 1.5"),
    (
        "float-token-whole",
        _with(response_ids=[3.0, 4.0]),
        "bad_type",
        "response_ids",
        "response_ids[0] = 3.0 (values must be integers)",
    ),
    (
        "null-token",
        _with(prompt_ids=[1, None]),
        "bad_type",
        "prompt_ids",
        "prompt_ids[1] = None (values must be integers)",
    ),
    ("float-mask", _with(mask=[1, 0.5]), "bad_mask", "mask", "mask[1] = 0.5 (mask must be 0 or 1)"),
    ("string-mask", _with(mask=[1, "1"]), "bad_type", "mask", "mask[1] = '1' (values must be 0/1 or booleans)"),
    ("huge-mask", _with(mask=[1, 2**70]), "bad_mask", "mask", "mask[1] = 1180591620717411303424"),
    (
        "huge-logprob",
        _with(engine_logprobs=[-0.5, -(10**400)]),
        "non_finite",
        "engine_logprobs",
        "engine_logprobs[1] = -inf",
    ),  # as the float -1e400 is
]


@pytest.mark.parametrize("name,line,kind,fieldname,text", BAD_LINES)
def test_bad_line_is_excluded_and_named(tmp_path, name, line, kind, fieldname, text):
    """Pins 'never silently dropped': the bad line is counted, located and its field named,
    and its good neighbours are still audited."""
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([json.dumps(GOOD), line, json.dumps(GOOD)]) + "\n")
    rep = audit(str(path))
    assert rep["sequences"] == 2 and rep["sequences_seen"] == 3
    assert rep["excluded_sequences"] == 1
    assert rep["excluded_by_kind"] == {kind: 1}
    (issue,) = rep["issues"]
    assert issue["line"] == 2 and issue["field"] == fieldname and issue["kind"] == kind
    assert issue["source"] == str(path) and text in issue["message"]
    assert rep["tokens"] == 4 and rep["exact_match_fraction"] == 1.0


@pytest.mark.parametrize("name,line,kind,fieldname,text", BAD_LINES)
def test_strict_makes_bad_line_fatal(tmp_path, name, line, kind, fieldname, text):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([json.dumps(GOOD), line]) + "\n")
    with pytest.raises(AuditInputError) as info:
        audit(str(path), strict=True)
    assert f"{path}:line 2: {fieldname}:" in str(info.value)


def test_rescore_fills_missing_trainer_logprobs():
    """Pins the rescoring API: any callable (prompt_ids, response_ids) -> logprobs."""
    seen = []

    def rescore(prompt, response):
        seen.append((prompt, response))
        return [-0.5, -1.0]

    rec = dict(GOOD)
    rec.pop("trainer_logprobs")
    rep = audit([rec, GOOD], rescore=rescore)
    assert seen == [([1, 2], [3, 4])]  # only where trainer_logprobs is absent
    assert rep["sequences"] == 2 and rep["exact_match_fraction"] == 1.0


RESCORE_FAILURES = [
    ("raises", lambda p, r: 1 / 0, "rescore_failed", "ZeroDivisionError"),
    ("wrong-length", lambda p, r: [-1.0], "count_mismatch", "1 values for 2"),
    ("positive", lambda p, r: [-1.0, 3.0], "positive_logprob", "= 3.0"),
    ("2-d", lambda p, r: [[-1.0, -1.0]], "bad_type", "shape"),
]


@pytest.mark.parametrize("name,fn,kind,text", RESCORE_FAILURES)
def test_bad_rescore_output_is_named(name, fn, kind, text):
    rec = dict(GOOD)
    rec.pop("trainer_logprobs")
    rep = audit([GOOD, rec, GOOD], rescore=fn)
    assert rep["excluded_by_kind"] == {kind: 1}
    assert rep["issues"][0]["row"] == 1 and text in rep["issues"][0]["message"]
    assert rep["sequences"] == 2


def test_mask_excludes_tokens_and_partial_masks_mix():
    """Pins masking: unmasked tokens are not audited; a sequence without mask is all 1."""
    a = dict(GOOD, id="a", trainer_logprobs=[-0.5, -3.0], mask=[1, 0])
    b = dict(GOOD, id="b")
    b.pop("mask")
    rep = audit([a, b])
    assert rep["tokens"] == 3 and rep["unmasked_tokens"] == 1
    assert rep["exact_match_fraction"] == 1.0
    bools = dict(GOOD, mask=[True, False])
    assert audit([bools])["tokens"] == 1


def test_values_out_of_the_compare_dtype_range_are_excluded():
    rec = dict(GOOD, id="big", engine_logprobs=[-1e300, -1.0])
    rep = audit([GOOD, rec], compare_dtype="float32")
    assert rep["excluded_by_kind"] == {"non_finite": 1}
    assert "out of the float32 range" in rep["issues"][0]["message"]
    assert audit([GOOD, rec])["excluded_sequences"] == 0  # fine in float64


def test_prompt_is_required_only_to_rescore(tmp_path):
    """Bug pinned: a file without prompt_ids audited 0 of its sequences, each
    excluded for `missing column 'prompt_ids'`, though comparing two logprob columns needs
    no prompt. Now the prompt is read when present and required only where a sequence is
    rescored (and then that sequence is excluded, naming why)."""
    no_prompt = dict(GOOD)
    no_prompt.pop("prompt_ids")
    rep = audit([no_prompt, no_prompt])
    assert rep["sequences"] == 2 and rep["excluded_sequences"] == 0 and rep["tokens"] == 4
    to_rescore = dict(no_prompt)
    to_rescore.pop("trainer_logprobs")
    rep = audit([no_prompt, to_rescore, dict(GOOD)], rescore=lambda prompt, resp: [-0.5] * len(resp))
    assert rep["sequences"] == 2 and rep["excluded_by_kind"] == {"missing_column": 1}
    (issue,) = rep["issues"]
    assert issue["row"] == 1 and issue["field"] == "prompt_ids"
    assert "needed to rescore" in issue["message"]
