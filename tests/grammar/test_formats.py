"""Tests of detsample/grammar/formats.py: every string a supported ``format`` lets the
grammar emit passes jsonschema's format checker.

Pins xgrammar's own format grammars admitting strings the checker rejects: ``date``
2023-02-31 and year 0000, ``ipv4`` with leading zeros, ``time`` with second 60.
"""

import json
import re

import jsonschema
import pytest
import xgrammar as xgr

from detsample.grammar.config import GrammarConfig
from detsample.grammar.formats import FORMAT_PATTERNS
from detsample.grammar.kinds import json_schema_grammar
from tests.grammar.conftest import generate, string_acceptor

CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
# (format, values the checker accepts, values it rejects that xgrammar's own grammar emits)
CASES = [
    (
        "date",
        ["2024-02-29", "2000-02-29", "0001-01-01", "2023-12-31"],
        ["2023-02-29", "1900-02-29", "0000-01-01", "2023-04-31"],
    ),
    ("time", ["23:59:59Z", "00:00:00.5+01:00"], ["12:00:60Z"]),
    ("date-time", ["2024-02-29T10:00:00Z"], ["2023-02-30T10:00:00Z"]),
    ("ipv4", ["0.0.0.0", "255.255.255.255", "10.1.20.3"], ["01.2.3.4", "1.2.3.04"]),
    ("ipv6", ["::", "::1", "fe80::1", "1:2:3:4:5:6:7:8", "1::"], []),
    ("uuid", ["123e4567-e89b-12d3-a456-426614174000"], []),
    ("email", ["a.b+c@example.com"], []),
    ("hostname", ["example.com", "a-b.c"], []),
]


def _checked(fmt, value):
    if fmt == "hostname":  # jsonschema checks hostnames only with the fqdn package
        return all(0 < len(x) <= 63 and not x.startswith("-") for x in value.split("."))
    # jsonschema checks time / date-time only with rfc3339-validator (a test dependency):
    # without it every string would "conform" and the rejections below would be vacuous
    assert fmt in CHECKER.checkers, f"jsonschema cannot check format {fmt!r} here"
    return CHECKER.conforms(value, fmt)


@pytest.mark.parametrize("fmt,good,bad", CASES, ids=[c[0] for c in CASES])
def test_format_grammar_accepts_good_and_rejects_bad(fmt, good, bad):
    acc = string_acceptor(json_schema_grammar(json.dumps({"type": "string", "format": fmt}), GrammarConfig()))
    for v in good:
        assert _checked(fmt, v) and acc(json.dumps(v).encode()), v
    upstream = string_acceptor(xgr.Grammar.from_json_schema(json.dumps({"type": "string", "format": fmt})))
    for v in bad:
        assert not _checked(fmt, v) and not acc(json.dumps(v).encode()), v
        if fmt != "date-time":
            assert upstream(json.dumps(v).encode()), v  # what the replacement is for


@pytest.mark.parametrize("fmt", sorted(FORMAT_PATTERNS))
def test_sampled_format_strings_pass_the_checker(fmt, vocab, submit):
    """Random logits through the format's grammar: every finished string conforms."""
    grammars = [submit("json_schema", {"type": "string", "format": fmt}, rid=f"{fmt}{i}") for i in range(12)]
    outs = generate(vocab, grammars, seed=7, max_steps=2000)
    for toks in outs:
        value = json.loads(vocab.decode(toks).decode("utf-8"))
        assert re.search(FORMAT_PATTERNS[fmt], value) and _checked(fmt, value), value
