"""Tests of detsample/grammar/schema.py: keywords the grammar cannot honour are rejected
at compile time, by name, never sampled into invalid output.

Pins xgrammar silently ignoring keywords (``uniqueItems``, ``not``, ``if``, a number's
``multipleOf``, a second ``allOf`` member, siblings of ``$ref`` / ``anyOf``) and treating
an overlapping ``oneOf`` as ``anyOf``: each let a request finish with output its schema
rejects.
"""

import copy
import json
import re
from pathlib import Path

import pytest
import torch

from detsample import Request, Sampler, SamplingBatch, SamplingParams
from detsample.errors import GrammarError
from detsample.grammar.batching import FINISH_GRAMMAR_ERROR, grammar_errors
from detsample.grammar.schema import KEYWORDS, check_json_schema, prepare_json_schema

DATA = Path(__file__).resolve().parents[1] / "data"
UNSUPPORTED = json.loads((DATA / "json_schemas_unsupported.json").read_text())
DOCS = Path(__file__).resolve().parents[2] / "docs" / "grammar.md"


@pytest.mark.parametrize("case", UNSUPPORTED, ids=[c["name"] for c in UNSUPPORTED])
def test_unsupported_keyword_is_rejected_by_name(case):
    with pytest.raises(GrammarError, match=re.escape(f"keyword '{case['keyword']}' at #")):
        check_json_schema(case["schema"])


def test_unsupported_schema_fails_its_request_only(vocab):
    """A rejected schema fails at compile time: its row samples no token and finishes
    with ``grammar_error`` naming the keyword; its neighbour samples normally."""
    bad = next(c for c in UNSUPPORTED if c["name"] == "unique_items")
    reqs = [
        Request("bad", SamplingParams(seed=1, json_schema=bad["schema"]), prompt_ids=[1]),
        Request("ok", SamplingParams(seed=2, json_schema={"type": "boolean"}), prompt_ids=[1]),
    ]
    batch = SamplingBatch.from_requests(reqs, vocab_size=vocab.vocab_size, vocab=vocab)
    out = Sampler().sample(torch.zeros(2, vocab.vocab_size), batch, torch.zeros(2, dtype=torch.long))
    batch.advance(out.token_ids)
    assert int(out.token_ids[0]) == -1 and int(out.token_ids[1]) >= 0
    assert batch.finished[0] == FINISH_GRAMMAR_ERROR and batch.finished[1] is None
    assert "keyword 'uniqueItems'" in grammar_errors(batch)["bad"]


# Schemas the check must accept (and what it must keep or rewrite).
ACCEPTED = [
    {"oneOf": [{"type": "integer"}, {"type": "string"}]},
    {"oneOf": [{"const": "a"}, {"enum": ["b", "c"]}]},
    {
        "oneOf": [
            {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]},
            {"type": "object", "properties": {"k": {"const": 2}, "x": {}}, "required": ["k"]},
        ]
    },
    {
        "$defs": {"a": {"type": "object", "properties": {"t": {"const": "a"}}, "required": ["t"]}},
        "oneOf": [{"$ref": "#/$defs/a"}, {"type": "null"}],
    },
    {"type": "string", "enum": ["x", "y"], "description": "annotations and type are fine"},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "x-vendor": 1, "nullable": True},
    {"allOf": [{"type": "integer", "minimum": 0}], "title": "one member"},
    {"properties": {"a": {"type": "integer"}}, "required": ["a"]},  # object implied
    {
        "type": "object",
        "additionalProperties": {"type": "integer"},
        "minProperties": 1,
        "properties": {"k": {"type": "integer"}},
        "required": ["k"],
    },
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}}},
    {"type": "integer", "minimum": 1.0, "multipleOf": 2},
]


@pytest.mark.parametrize("schema", ACCEPTED)
def test_supported_schemas_are_accepted_and_not_modified(schema):
    before = copy.deepcopy(schema)
    prepared = prepare_json_schema(json.dumps(schema))
    assert schema == before
    assert json.dumps(prepared.schema)  # serialisable for xgrammar


def test_patterns_and_formats_become_placeholders():
    schema = {
        "type": "object",
        "properties": {
            "d": {"type": "string", "format": "date"},
            "p": {"type": "string", "pattern": "^[a-z]+$"},
            "q": {"type": "string", "pattern": "^[a-z]+$"},
        },
        "patternProperties": {"^x_[0-9]$": {"type": "integer"}},
    }
    prepared = prepare_json_schema(schema)
    props = prepared.schema["properties"]
    assert "format" not in props["d"] and props["p"]["pattern"] == props["q"]["pattern"]
    assert len(prepared.patterns) == 3  # date, [a-z]+ (shared), the property-name pattern
    assert set(prepared.patterns) == {
        props["d"]["pattern"],
        props["p"]["pattern"],
        *prepared.schema["patternProperties"],
    }


def test_oneof_rejection_names_the_fix():
    with pytest.raises(GrammarError, match="use anyOf"):
        check_json_schema({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]})


def test_non_strict_mode_counts_extra_keys():
    """Without strict mode an object admits extra keys, so minProperties is unsafe."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 1}
    check_json_schema(schema, strict=True)
    with pytest.raises(GrammarError, match="minProperties"):
        check_json_schema(schema, strict=False)


def test_invalid_json_text_is_named():
    with pytest.raises(GrammarError, match="not valid JSON"):
        prepare_json_schema("{nope")


def test_docs_table_lists_every_supported_keyword():
    text = DOCS.read_text()
    missing = [k for k in KEYWORDS if f"| `{k}` |" not in text]
    assert not missing, f"docs/grammar.md keyword table lacks {missing}"
