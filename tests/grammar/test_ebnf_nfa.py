"""Tests of detsample/grammar/ebnf_nfa.py: xgrammar's printed EBNF read into an NFA.

The NFA only names matcher states, so what must hold is that it derives exactly the
grammar's language (a wrong node set would merge states with different masks). Pins a
bounded repetition expanded as an unbounded one, a negated class that admits the
characters it excludes, escapes read as the wrong codepoint, a right-recursive rule
rejected (xgrammar lowers every ``x*`` to one), and recursion other than at a rule's
end accepted (it is not regular: it must be refused).
"""

import re

import pytest
import xgrammar as xgr
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.grammar import ebnf_nfa
from detsample.grammar.ebnf_nfa import Unsupported, build_nfa, parse_rules

# (grammar, accepted, rejected)
LANGUAGES = [
    ('root ::= "ab" | "c"', ["ab", "c"], ["", "a", "abc", "cc"]),
    ('root ::= [a-c]* "d"', ["d", "abcd", "cccd"], ["", "abc", "dd", "ed"]),
    ("root ::= [^a-c]", ["d", "é", "\x00", "\U0010ffff"], ["a", "b", "c", "", "dd"]),
    ('root ::= x{2, 3}\nx ::= "a" | "bc"', ["aa", "abc", "bcbcbc", "aaa"], ["a", "aaaa", ""]),
    ('root ::= x{1, -1}\nx ::= "a"', ["a", "aaaaaa"], [""]),
    ('root ::= "x" y\ny ::= "" | ("a" y)', ["x", "xa", "xaaa"], ["", "a", "xb"]),
    ('root ::= "\\"\\\\\\n\\t\\u00e9\\x41"', ['"\\\n\té' + "A"], ['"\\nté']),
    ("root ::= [\\0-\\x1f\\]\\-]", ["\x00", "\x1f", "]", "-"], [" ", "a", "\\"]),
    ('root ::= "a"? "b"+', ["b", "ab", "abbb"], ["a", "", "aab"]),
    ('root ::= x (=("y"))\nx ::= "a"', ["a"], ["b"]),  # a rule's lookahead is dropped
]


@pytest.mark.parametrize("text,good,bad", LANGUAGES)
def test_nfa_derives_exactly_the_language(text, good, bad):
    nfa, start = build_nfa(text)
    for s in good:
        assert nfa.matches(start, s), s
    for s in bad:
        assert not nfa.matches(start, s), s


UNSUPPORTED = [
    ('root ::= x "b"\nx ::= "a" x "b" | ""', "recurses"),  # a^n b^n: not regular
    ('root ::= root "a" | "b"', "recurses"),  # left recursion
    ('root ::= TagDispatch(("a", x))\nx ::= "b"', "unexpected"),
    ("root ::= y", "undefined"),
    ('x ::= "a"', "no rule"),
    ('root ::= "a', "unterminated"),
    ("root ::= [ab", "unterminated"),
    ('root ::= "\\u12"', "escape"),
    ('root ::= ("a" (=("b"))) "b"', "expected"),  # a lookahead only ends a rule
]


@pytest.mark.parametrize("text,match", UNSUPPORTED)
def test_unsupported_grammars_are_refused(text, match):
    with pytest.raises(Unsupported, match=match):
        build_nfa(text)


def test_expansion_bound_is_enforced(monkeypatch):
    monkeypatch.setattr(ebnf_nfa, "MAX_NODES", 50)
    with pytest.raises(Unsupported, match="past 50"):
        build_nfa("root ::= [a-z]{0, 100}")


def test_lookahead_and_rule_names_are_read():
    rules = parse_rules('root ::= (("[" a-b.c "]")) (=("x"))\na-b.c ::= [0-9]')
    assert set(rules) == {"root", "a-b.c"}


# -- property: regexes through xgrammar's own printer, against Python's re ----------
_ATOMS = st.sampled_from(["a", "b", "c", "[ab]", "[^a]", "[a-c]", ".", "(a|bc)", "\\d"])


@st.composite
def _regex(draw, depth=0):
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        nested = depth < 2 and draw(st.booleans())
        atom = f"({draw(_regex(depth + 1))})" if nested else draw(_ATOMS)
        q = draw(st.sampled_from(["", "", "*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}"]))
        parts.append(atom + q)
    alt = "".join(parts)
    if depth == 0 and draw(st.booleans()):
        alt = alt + "|" + draw(_ATOMS)
    return alt


@settings(max_examples=150, deadline=None)
@given(_regex(), st.lists(st.text(alphabet="abc1\n", max_size=7), min_size=1, max_size=25))
def test_regex_grammars_match_python_re(pattern, strings):
    """Property: a regex printed as EBNF by xgrammar (right-recursive rules for every
    repetition) derives exactly the strings Python's ``re`` matches."""
    text = str(xgr.Grammar.from_regex(pattern))
    try:
        nfa, start = build_nfa(text)
    except Unsupported as e:  # only what is not regular may be refused
        pytest.fail(f"{pattern!r} -> {text!r}: {e}")
    rx = re.compile(pattern, re.DOTALL)
    for s in strings:
        want = rx.fullmatch(s) is not None and ("\n" not in s or "." not in pattern)
        if "." in pattern and "\n" in s:
            continue  # xgrammar's "." and re's differ on newlines; not the NFA's concern
        assert nfa.matches(start, s) == want, (pattern, text, s)
