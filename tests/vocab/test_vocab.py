"""Tests of detsample/vocab.py: the default layout, encode/decode, specials, fingerprint."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import InvalidSamplingParams, Vocabulary
from detsample.vocab import DEFAULT_MERGES

# Pinned: the reference model's embedding rows follow this exact layout.
DEFAULT_FINGERPRINT = "b21728db7473"

BAD_VOCABS = [
    ([], [0], (), "tokens must not be empty"),
    ([b"", b"a"], [2], (), "eos_token_ids must hold token ids in [0, 2)"),
    ([b"", b"a"], [], (), "eos_token_ids must name at least one token"),
    ([b"", b"a", b""], [0], (), "tokens[2] is empty but not special"),
    ([b"", 3], [0], (), "tokens[1] must be bytes or str"),
    ([b"", b"a"], [0], [5], "special_ids must hold token ids in [0, 2)"),
]

GREEDY_CASES = [
    (" the", [" the"]),
    ('{"name": "x"}', ['{"', "name", '": "', "x", '"}']),
    ("true", ["true"]),
    ("\n    ", ["\n    "]),
]


def _merge_id(piece: str) -> int:
    return 257 + DEFAULT_MERGES.index(piece)


def test_default_layout():
    """Pins the shared layout: id 0 EOS b"", ids 1..256 bytes, 255 merged tokens."""
    v = Vocabulary.default()
    assert v.vocab_size == 512 and len(v.tokens) == 512
    assert v.tokens[0] == b"" and v.eos_token_ids == (0,) and v.special_ids == {0}
    assert all(v.tokens[b + 1] == bytes([b]) for b in range(256))
    merges = v.tokens[257:]
    assert len(merges) == 255 and len(set(merges)) == 255
    assert all(len(m) > 1 for m in merges)
    assert v.fingerprint.startswith(DEFAULT_FINGERPRINT)


def test_default_merges_contain_json_pieces():
    """The default must hold the JSON pieces grammar outputs use."""
    for piece in ['{"', '":', '", "', "true", "false", "null"]:
        assert piece in DEFAULT_MERGES


def test_fingerprint_stable_and_sensitive():
    """Bug pinned: a cache keyed by a fingerprint that ignores specials/EOS serves a
    grammar compiled for another vocabulary."""
    a, b = Vocabulary.default(), Vocabulary.default()
    assert a.fingerprint == b.fingerprint and a == b and hash(a) == hash(b)
    toks = list(a.tokens)
    toks[300] = b"zz-other"
    assert Vocabulary.from_tokens(toks, eos_token_ids=[0]).fingerprint != a.fingerprint
    assert Vocabulary.from_tokens(a.tokens, eos_token_ids=[0], special_ids=[0, 1]).fingerprint != a.fingerprint
    assert Vocabulary.from_tokens(a.tokens, eos_token_ids=[0, 1]).fingerprint != a.fingerprint


@pytest.mark.parametrize("text,pieces", GREEDY_CASES)
def test_encode_greedy_longest_match(text, pieces):
    v = Vocabulary.default()
    expect = [_merge_id(p) if len(p.encode()) > 1 else p.encode()[0] + 1 for p in pieces]
    assert v.encode(text) == expect


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=64))
def test_encode_decode_roundtrip_and_longest(data):
    """Round trip, and at each step no longer token matches (greedy longest match)."""
    v = Vocabulary.default()
    ids = v.encode(data)
    assert v.decode(ids) == data
    assert 0 not in ids
    pos = 0
    for tid in ids:
        tok = v.tokens[tid]
        assert data.startswith(tok, pos)
        longer = [t for t in v.tokens[1:] if len(t) > len(tok) and data.startswith(t, pos)]
        assert not longer
        pos += len(tok)


def test_encode_is_deterministic_for_str_and_bytes():
    v = Vocabulary.default()
    s = 'héllo {"a": [true, null]} the world'
    assert v.encode(s) == v.encode(s.encode("utf-8")) == v.encode(s)


def test_specials_decode_empty_and_are_never_encoded():
    """Bug pinned: text spelling a special token must not encode to the special id."""
    toks = [b"<eos>", b"<pad>"] + [bytes([b]) for b in range(256)]
    v = Vocabulary.from_tokens(toks, eos_token_ids=[0], special_ids=[1])
    assert v.special_ids == {0, 1}
    assert v.decode([0, 1, 2 + ord("a")]) == b"a"
    ids = v.encode("<eos><pad>")
    assert 0 not in ids and 1 not in ids and v.decode(ids) == b"<eos><pad>"


def test_encode_fails_on_unspellable_bytes():
    v = Vocabulary.from_tokens([b"", b"a", b"b"], eos_token_ids=[0])
    with pytest.raises(InvalidSamplingParams, match=r"cannot encode byte b'c' at offset 2"):
        v.encode("abc")


def test_decode_rejects_out_of_range():
    with pytest.raises(InvalidSamplingParams, match=r"token id must be in \[0, 512\), got 512"):
        Vocabulary.default().decode([1, 512])


@pytest.mark.parametrize("tokens,eos,special,msg", BAD_VOCABS)
def test_bad_vocab_rejected(tokens, eos, special, msg):
    with pytest.raises(InvalidSamplingParams, match=msg.replace("[", r"\[").replace(")", r"\)")):
        Vocabulary.from_tokens(tokens, eos_token_ids=eos, special_ids=special)


def test_xgrammar_tokenizer_info_treats_specials_as_empty():
    """Special tokens reach xgrammar as b"" so no grammar can allow them as text."""
    toks = [b"", b"<pad>"] + [bytes([b]) for b in range(256)]
    v = Vocabulary.from_tokens(toks, eos_token_ids=[0], special_ids=[1])
    info = v.xgrammar_tokenizer_info()
    assert info.vocab_size == 258
    assert list(info.stop_token_ids) == [0]
    assert list(info.special_token_ids) == [1]
    assert v.xgrammar_tokenizer_info() is info


def test_grammar_compiler_is_per_instance_and_lazy():
    """No global state: two vocabularies never share a compiler object."""
    a, b = Vocabulary.default(), Vocabulary.default()
    assert a.grammar_compiler is a.grammar_compiler
    assert a.grammar_compiler is not b.grammar_compiler


def test_configure_grammar_sets_the_compilers_options_once():
    """The compiler ``configure_grammar`` builds is the one grammars use; a second
    configuration, or one after the first grammar, is refused (it would drop the
    compilations made under the first options)."""
    from detsample.grammar import GrammarConfig

    v = Vocabulary.default()
    c = v.configure_grammar(GrammarConfig(compile_timeout_s=None))
    assert v.grammar_compiler is c and c.config.compile_timeout_s is None
    with pytest.raises(ValueError, match="already has a grammar compiler"):
        v.configure_grammar(GrammarConfig())
