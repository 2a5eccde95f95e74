"""Tests of detsample/grammar/regex.py: JSON-Schema patterns lowered to EBNF.

Pins xgrammar's own regex path accepting strings the validator rejects (``a{0,2}|a``
accepting ``aaaa``, ``a(cb*)?`` accepting ``ab``, ``\\W`` admitting ``é``, surrogates
from ``.``), and the soundness property: every string the lowered grammar spells decodes
to one ``re.search(pattern, s)`` accepts.
"""

import itertools
import json
import re

import pytest
import xgrammar as xgr
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.errors import GrammarError
from detsample.grammar.config import GrammarConfig
from detsample.grammar.kinds import json_schema_grammar
from detsample.grammar.regex import class_text, complement, json_chars, pattern_ebnf, python_class, subtract
from tests.grammar.conftest import string_acceptor


def grammar(pattern):
    return json_schema_grammar(json.dumps({"type": "string", "pattern": pattern}), GrammarConfig())


def accepts(g, s: str) -> bool:
    return string_acceptor(g)(json.dumps(s, ensure_ascii=False).encode())


def upstream_accepts(pattern, s):
    g = xgr.Grammar.from_json_schema(json.dumps({"type": "string", "pattern": pattern}))
    return accepts(g, s)


# (pattern, a string xgrammar's own regex path wrongly accepts)
UPSTREAM_WRONG = [
    ("^(?:a{0,2}|a)$", "aaaa"),
    ("^a(cb*)?$", "ab"),
    ("^\\W$", "é"),
]


@pytest.mark.parametrize("pattern,s", UPSTREAM_WRONG)
def test_upstream_regex_path_is_wrong_and_ours_is_not(pattern, s):
    assert not re.search(pattern, s)
    assert upstream_accepts(pattern, s)  # the reason patterns bypass xgrammar's regex
    assert not accepts(grammar(pattern), s)


# (pattern, accepted, rejected)
CASES = [
    ("^[a-z]+$", ["abc"], ["", "aB", "a1"]),
    ("^\\d{3}-\\d{4}$", ["555-1234"], ["5551234", "555-123", "٣٣٣-1234"]),
    ("^.+$", ["a", "\t", '"', "\\", "é😀"], ["", "\n"]),  # escapes spell what needs one
    ("^.{1,3}$", ["a", "é😀"], ["", "abcd", "\n", "\t"]),  # bounded: raw characters only
    ("^[^,]+$", ["a b", '"q"', "\x01"], ["a,b", ""]),
    ('^a"b$', ['a"b'], ["ab"]),
    ("^(😀|é)$", ["😀", "é"], ["e"]),
    ("^\\S+$", ["ab"], ["a b", "\u3000", "\x85"]),
    ("^\\D$", ["x", "é"], ["1", "٣"]),
    ("abc", ["abc"], ["xabc"]),  # unanchored: the whole string (a subset of search)
    ("^(?:ab|cd)*$", ["", "abcd"], ["abc"]),
]


@pytest.mark.parametrize("pattern,good,bad", CASES)
def test_lowered_pattern_accepts_and_rejects(pattern, good, bad):
    acc = string_acceptor(grammar(pattern))
    for s in good:
        assert re.search(pattern, s) and acc(json.dumps(s, ensure_ascii=False).encode()), s
    for s in bad:
        assert not acc(json.dumps(s, ensure_ascii=False).encode()), s


@pytest.mark.parametrize(
    "pattern,what",
    [
        ("(a)\\1", "backreference"),
        ("(?=a)a", "lookaround"),
        ("(?!a)b", "lookaround"),
        ("a^b", "anchor"),
        ("a$b", "anchor"),
        ("(?i)a", "inline flag"),
        ("\\bfoo", "word boundary"),
        ("a*+", "possessive"),
        ("(?>a)", "atomic"),
        ("[", "not a valid regular expression"),
        ("[\ud800]", "no character"),
    ],
)
def test_untranslatable_constructs_are_rejected_by_name(pattern, what):
    with pytest.raises(GrammarError, match=what):
        pattern_ebnf(pattern)


def test_class_algebra():
    assert complement(((0, 9), (20, 0x10FFFF))) == ((10, 19),)
    assert subtract(((0, 100),), ((10, 20), (50, 60))) == ((0, 9), (21, 49), (61, 100))
    assert class_text(((0x2D, 0x2D), (0x61, 0x7A))) == "[^\\u0000-\\u002C\\u002E-\\u0060\\u007B-\\U0010FFFF]"
    assert json_chars(((0xD800, 0xDFFF),)) is None
    assert json_chars(((0x22, 0x22),)) == '"\\\\\\""'


def test_python_class_matches_re():
    digits = python_class("DIGIT")
    for lo, hi in digits[:5] + digits[-3:]:
        assert re.fullmatch(r"\d", chr(lo)) and re.fullmatch(r"\d", chr(hi))
    assert not re.fullmatch(r"\d", chr(digits[0][1] + 1))


_ATOMS = ["a", "b", '"', "\\n", "[ab]", "[^a]", ".", "\\W", "\\s", "\\d", '[\\n"b]']


@st.composite
def regexes(draw, depth=0):
    kind = draw(st.integers(0, 3)) if depth < 3 else 0
    if kind == 0:
        return draw(st.sampled_from(_ATOMS))
    if kind == 1:
        return draw(regexes(depth + 1)) + draw(regexes(depth + 1))
    if kind == 2:
        return f"({draw(regexes(depth + 1))}|{draw(regexes(depth + 1))})"
    q = draw(st.sampled_from(["?", "*", "+", "{0,2}", "{2}", "{1,}", "??"]))
    return f"({draw(regexes(depth + 1))}){q}"


_STRINGS = ["".join(p) for n in range(4) for p in itertools.product('ab"\n1', repeat=n)]


@settings(max_examples=50, deadline=None)
@given(regexes(), st.sampled_from(["^", ""]), st.sampled_from(["$", ""]))
def test_lowering_is_sound(body, head, tail):
    """Property: every short string the lowered grammar accepts is accepted by Python's
    ``re.search`` on the original pattern (the validator's check)."""
    pattern = head + body + tail
    acc = string_acceptor(grammar(pattern))
    rx = re.compile(pattern)
    for s in _STRINGS:
        if acc(json.dumps(s, ensure_ascii=False).encode()):
            assert rx.search(s), (pattern, s)
