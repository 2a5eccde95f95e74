"""Tests of detsample/grammar/ebnf.py: the corrected JSON-schema grammar.

Pins xgrammar's length-bounded string defect (a ``minLength``/``maxLength`` string is
lowered to ``[^"\\\\\\r\\n]{a,b}``: raw control characters in, so a strict
``json.loads`` of the output fails with "Invalid control character"), the UTF-8 encoded
surrogates every negated class admits, and lone ``\\uD800`` escapes.
"""

import json

import pytest
import torch
import xgrammar as xgr
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import Vocabulary
from detsample.errors import GrammarError
from detsample.grammar import GrammarMasker, RequestGrammar
from detsample.grammar.config import GrammarConfig
from detsample.grammar.ebnf import STRING_EXCLUDE, correct_json_grammar, exclude_from_negated_classes
from detsample.grammar.kinds import json_schema_grammar
from tests.grammar.conftest import generate, string_acceptor

BOUNDED = {"type": "string", "minLength": 1, "maxLength": 5}
BYTES = Vocabulary.from_tokens([b""] + [bytes([b]) for b in range(256)], eos_token_ids=[0])


def accepts(grammar, data: bytes) -> bool:
    return string_acceptor(grammar)(data)


def ours(schema):
    return json_schema_grammar(json.dumps(schema), GrammarConfig())


def upstream(schema):
    return xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)


# (schema, JSON text, accepted after correction)
CASES = [
    (BOUNDED, b'"a\tb"', False),  # raw TAB: strict json.loads rejects it
    (BOUNDED, b'"\x01"', False),
    (BOUNDED, b'"a\\tb"', False),  # bounded strings hold no escapes (fast masks)
    (BOUNDED, '"ééééé"'.encode(), True),  # code points, not bytes
    (BOUNDED, '"éééééé"'.encode(), False),
    (BOUNDED, b'"\xed\xa0\x80"', False),  # U+D800 spelled in UTF-8: invalid UTF-8
    (BOUNDED, b'"\xed\x9f\xbf"', True),  # U+D7FF, the last code point before them
    (BOUNDED, '"a😀"'.encode(), True),
    (BOUNDED, b'""', False),
    ({"type": "string"}, b'"\xed\xbf\xbf"', False),
    ({"type": "string"}, b'"\\ud800"', False),  # a lone surrogate escape
    ({"type": "string"}, b'"\\ue000\\n\\"\xf0\x9f\x98\x80"', True),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, b'{"\xed\xa0\x80": 1}', False),
    (
        {"type": "object", "propertyNames": {"maxLength": 3}, "additionalProperties": {"type": "integer"}},
        b'{"a\tb": 1}',
        False,
    ),
    (
        {"type": "object", "propertyNames": {"maxLength": 3}, "additionalProperties": {"type": "integer"}},
        b'{"a b": 1}',
        True,
    ),
]


@pytest.mark.parametrize("schema,text,ok", CASES)
def test_corrected_grammar_accepts_exactly_valid_json(schema, text, ok):
    """Control characters, surrogates and lone surrogate escapes are out; JSON escapes
    count as one character of a bounded string."""
    assert accepts(ours(schema), text) is ok
    if ok:
        value = json.loads(text.decode("utf-8"))
        assert json.dumps(value).encode("utf-8", "strict")  # round-trips as UTF-8


def test_upstream_still_has_the_length_defect():
    """What the correction is for: xgrammar's own grammar admits a raw TAB and refuses
    the escaped one (if this starts failing, upstream fixed it)."""
    g = upstream(BOUNDED)
    assert accepts(g, b'"a\tb"') and not accepts(g, b'"a\\tb"')


def _sample_bounded_string(prefer: bytes, steps: int = 12) -> bytes:
    """Greedy sampling over the byte vocabulary with logits that prefer ``prefer``'s
    bytes: the path a model that likes TABs takes through a maxLength string."""
    vocab = BYTES
    g = RequestGrammar.submit("r", "json_schema", BOUNDED, vocab)
    masker = GrammarMasker()
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        logits = torch.randn(1, vocab.vocab_size, generator=gen)
        logits[0, [b + 1 for b in prefer]] += 20.0
        logits[0, 0] += 5.0  # EOS once allowed
        if not masker.apply_(logits, [g]):
            break
        t = int(logits.argmax())
        g.accept_token(t)
        out.append(t)
    return vocab.decode(out)


def test_control_characters_are_masked_during_sampling():
    """The pinned defect end to end: a model that prefers control characters inside a
    maxLength string must still produce strict JSON (the unpatched grammar emits the
    raw TAB and ``json.loads`` raises "Invalid control character")."""
    text = _sample_bounded_string(b"\t\x01\n")
    assert not any(b < 0x20 for b in text), text
    value = json.loads(text.decode("utf-8"))
    assert 1 <= len(value) <= 5


def test_control_character_bits_are_off_in_the_mask():
    vocab = BYTES
    g = RequestGrammar.submit("r", "json_schema", BOUNDED, vocab)
    g.resolve(60)
    g.accept_token(ord('"') + 1)
    bm = torch.zeros((1, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    g.fill_bitmask(bm, 0)
    allowed = {t for t in range(vocab.vocab_size) if (int(bm[0, t // 32]) >> (t % 32)) & 1}
    assert not allowed & {b + 1 for b in range(0x20)}
    assert ord("a") + 1 in allowed and ord('"') + 1 not in allowed  # at least one char


@settings(max_examples=40, deadline=None)
@given(
    st.text(st.characters(exclude_categories=("Cs", "Cc"), exclude_characters='"\\'), max_size=6),
    st.integers(0, 4),
    st.integers(0, 3),
)
def test_length_bounds_count_code_points_of_the_decoded_string(s, lo, extra):
    """Property: a bounded string (no character that needs an escape) is accepted iff
    its length in code points is within [minLength, maxLength]."""
    g = ours({"type": "string", "minLength": lo, "maxLength": lo + extra})
    text = json.dumps(s, ensure_ascii=False).encode("utf-8")
    assert accepts(g, text) is (lo <= len(s) <= lo + extra)


@pytest.mark.parametrize(
    "body,want",
    [
        (r"([^\"\\\r\n] x)", r"([^\"\\\r\n" + STRING_EXCLUDE + r"] x)"),
        (r'("[^a]" [^b])', r'("[^a]" [^b' + STRING_EXCLUDE + r"])"),  # literal untouched
        (r"([a-z] [\]^])", r"([a-z] [\]^])"),  # positive classes kept
        (r'(Regex("[^x]", json_string=true))', r'(Regex("[^x]", json_string=true))'),
    ],
)
def test_negated_classes_gain_the_string_exclusions(body, want):
    assert exclude_from_negated_classes(body) == want


def test_pattern_placeholders_are_inlined_and_none_survive():
    ebnf = (
        'root ::= (("\\"" root_1 "\\"") | ("[" root_1 "]") | root_10)\n'
        'root_1 ::= Regex("PH0Z", json_string=true)\nroot_10 ::= "x"\n'
    )
    out = correct_json_grammar(ebnf, {"PH0Z": '"ab"'})
    assert "PH0Z" not in out and "root_1 " not in out and "root_10" in out
    assert '("\\"" ("ab") "\\"")' in out  # inlined where it was used
    assert accepts(xgr.Grammar.from_ebnf(out), b'"ab"')
    with pytest.raises(GrammarError, match="survived"):
        correct_json_grammar(
            ebnf.replace('Regex("PH0Z", json_string=true)', 'Regex("PH0Z", json_string=false)'), {"PH0Z": '"ab"'}
        )


ODD = 'a"b\\c\nd\te\x01é😀'
# enum, const and property names: xgrammar spells them as JSON escapes (checked, no fix)
LITERAL_SCHEMAS = [
    {"enum": [ODD, "plain"]},
    {"const": {ODD: [ODD]}},
    {"type": "object", "properties": {ODD: {"type": "integer"}}, "required": [ODD]},
]


@pytest.mark.parametrize("schema", LITERAL_SCHEMAS)
def test_enum_const_and_property_names_are_escaped(schema):
    """The other string paths: the escaped spelling is accepted, a raw control character
    or quote is not, and random byte-level sampling ends in strict, valid JSON."""
    import jsonschema

    acc = string_acceptor(ours(schema))
    kind = next(iter(schema))
    value = {"enum": ODD, "const": {ODD: [ODD]}}.get(kind, {ODD: 7})
    seps = (",", ":") if kind == "const" else (", ", ": ")  # a const is spelled compactly
    good = json.dumps(value, ensure_ascii=False, separators=seps).encode()
    assert acc(good)
    assert not acc(good.replace(b"\\t", b"\t"))
    g = RequestGrammar.submit("r", "json_schema", schema, BYTES)
    toks = generate(BYTES, [g], seed=3, max_steps=300)[0]
    jsonschema.validate(json.loads(BYTES.decode(toks).decode("utf-8")), schema)
