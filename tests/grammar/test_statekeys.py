"""Tests of detsample/grammar/statekeys.py and the mask cache in
detsample/grammar/masker.py: a matcher state's bitmask row filled once.

The cache is sound only if two matchers with one state name always get the same bits.
The corpus tests (test_corpus.py) and every test using the ``vocab`` fixture run with
``verify_mask_cache``: each copied row is checked against a fresh xgrammar fill. Here:
that check fails on a wrong name; names survive rollback, fork and jump-forward; a text
ending inside a UTF-8 character or not UTF-8 at all is never named; rows of one state
are filled once; the bounds hold; and whole sampling sessions give the same bits with
the cache on and off (with and without prefetch).
"""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import Sampler, SamplingBatch, Vocabulary
from detsample.errors import GrammarError
from detsample.grammar import GrammarMasker, RequestGrammar, statekeys
from detsample.grammar.compiler import GrammarCompiler
from detsample.grammar.config import GrammarConfig
from detsample.grammar.statekeys import UNNAMED, StateKeys
from tests.helpers import params_strategy

from .conftest import generate, grammar_requests, random_session, same_steps

INT_ARRAY = {"type": "array", "items": {"type": "integer"}, "maxItems": 6}
OBJ = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                        "n": {"type": "integer"}}, "required": ["name", "n"]}


def _with_config(vocab, **kw):
    vocab._compiler = GrammarCompiler(vocab, GrammarConfig(**kw))
    return vocab


def _bytes_vocab():
    return Vocabulary.from_tokens([b""] + [bytes([b]) for b in range(256)] +
                                  [b"\xc3\xa9", b"ab", b"\xc3"[:1] + b"a"], eos_token_ids=[0])


def test_verify_catches_a_wrong_name(vocab, submit, monkeypatch):
    """Bug pinned: a name that does not change with the text (every state one name)
    copies the first row everywhere; the verifying fill must refuse it."""
    monkeypatch.setattr(StateKeys, "step", lambda self, sid, tid: sid)
    gs = [submit("json_schema", INT_ARRAY, rid=f"w{i}") for i in range(3)]
    with pytest.raises(GrammarError, match="cached bitmask row of state .* differs"):
        generate(vocab, gs, seed=1, max_steps=50)


def test_rows_in_one_state_are_filled_once_and_the_bits_are_xgrammars(vocab, submit,
                                                                        monkeypatch):
    gs = [submit("json_schema", OBJ, rid=f"s{i}") for i in range(6)]
    filled = []
    masker = GrammarMasker(parallel_min_rows=1)
    real = masker._fill_rows
    monkeypatch.setattr(masker, "_fill_rows", lambda role, th, grammars, bm, rows: (
        filled.append(list(rows)), real(role, th, grammars, bm, rows))[1])
    bm, rows = masker.fill(gs, vocab.vocab_size)
    assert filled[0] == [0]  # six rows, one state: one xgrammar fill
    assert len(filled) == 2 and filled[1] == [1, 2, 3, 4, 5]  # (the verifying fill)
    plain = GrammarMasker().bitmask(6, vocab.vocab_size)
    for r in rows:
        gs[r].matcher.fill_next_token_bitmask(plain, r)
    assert torch.equal(bm[rows], plain[rows])
    filled.clear()
    masker.fill(gs, vocab.vocab_size)
    assert filled == [[0, 1, 2, 3, 4, 5]]  # a hit for every row (only the check fills)


def test_names_follow_rollback_fork_and_jump_forward(vocab, submit):
    g = submit("json_schema", OBJ, rid="r")
    generate(vocab, [g], seed=3, max_steps=200)
    keys = g._keys
    assert keys is not None

    def replay(toks):
        sids = [keys.start]
        for t in toks:
            sids.append(keys.step(sids[-1], t))
        return sids

    assert g._sids == replay(g.accepted)
    g.rollback(5)
    assert g._sids == replay(g.accepted) and len(g._sids) == len(g.accepted) + 1
    f = g.fork()
    f.rollback(2)
    assert g._sids == replay(g.accepted) and f._sids == replay(f.accepted)
    f.jump_forward()
    assert f._sids == replay(f.accepted)
    # another request of the grammar shares its keys and starts at the start's name
    h = submit("json_schema", OBJ, rid="h")
    h.resolve()
    assert h.mask_state() == (keys, keys.start)


def test_texts_inside_or_outside_utf8_are_not_named():
    vocab = _bytes_vocab()
    tid = {t: i for i, t in enumerate(vocab.tokens)}
    compiler = GrammarCompiler(vocab)
    compiler.compile("regex", "[a-zé]+")
    keys = compiler.state_keys("regex", "[a-zé]+")
    a, e = keys.step(keys.start, tid[b"a"]), keys.step(keys.start, tid[b"\xc3\xa9"])
    assert keys.named(a) and keys.named(e) and a == e  # same future: same name
    half = keys.step(keys.start, tid[b"\xc3"])
    assert half != UNNAMED and not keys.named(half)  # inside a character
    assert keys.step(half, tid[b"\xa9"]) == e
    for bad in (b"\xff", b"\xc3a", b"\xa9"):  # not UTF-8: never named again
        sid = keys.start
        for b in bad:
            sid = keys.step(sid, tid[bytes([b])])
        assert sid == UNNAMED and keys.step(sid, tid[b"a"]) == UNNAMED
    assert keys.step(keys.start, 0) == keys.start  # a stop token leaves the name
    compiler.close()


@pytest.mark.parametrize("bound", ["MAX_STATES", "MAX_STATE_NODES"])
def test_state_bounds_leave_states_unnamed(monkeypatch, bound):
    """A grammar past either bound still samples, its rows filled by xgrammar."""
    monkeypatch.setattr(statekeys, bound, 3 if bound == "MAX_STATES" else 1)
    vocab = _with_config(Vocabulary.default(), verify_mask_cache=True)
    g = RequestGrammar.submit("b", "json_schema", OBJ, vocab)
    generate(vocab, [g], seed=2, max_steps=300)
    keys = g._keys
    assert UNNAMED in g._sids and g.is_terminated()
    if bound == "MAX_STATES":
        assert keys.num_states == 3
    else:  # (the start state is interned before any bound applies)
        assert all(len(keys._states[s][0]) <= 1 for s in g._sids[1:] if s != UNNAMED)


def test_mask_cache_keeps_at_most_max_masks(vocab, submit):
    g = submit("json_schema", OBJ, rid="m")
    g.resolve()
    keys = g._keys
    keys.max_masks = 2
    row = torch.zeros(keys.width, dtype=torch.int32)
    sids = [keys.start] + [keys.step(keys.start, t) for t in range(1, 200)]
    named = [s for s in dict.fromkeys(sids) if keys.named(s)][:4]
    for s in named:
        keys.store(s, row)
    assert list(keys._masks) == named[-2:]  # least recently used dropped first


def test_unexpandable_or_disabled_grammars_have_no_names(vocab):
    rec = {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}},
           "$ref": "#/$defs/n"}
    compiler = vocab.grammar_compiler
    compiler.compile("json_schema", json.dumps(rec))
    assert compiler.state_keys("json_schema", json.dumps(rec)) is None  # recursive
    off = _with_config(Vocabulary.default(), mask_cache=False)
    g = RequestGrammar.submit("o", "json_schema", OBJ, off)
    out = generate(off, [g], seed=0, max_steps=300)
    assert g._keys is None and g.mask_state() is None and out[0]


# -- property: whole sessions, cache on and off ----------------------------------------
GRAMMARS = [None, ("json_schema", OBJ), ("json_schema", INT_ARRAY),
            ("regex", "[a-z]{2,9}( [0-9]{1,3})?"), ("ebnf", 'root ::= "x" [0-9]* "."')]
_VOCABS: dict = {}


def _session_vocab(cache: bool) -> Vocabulary:
    if cache not in _VOCABS:
        _VOCABS[cache] = _with_config(Vocabulary.default(), mask_cache=cache)
    return _VOCABS[cache]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(params_strategy(512), st.sampled_from(range(len(GRAMMARS)))),
                min_size=1, max_size=6),
       st.sampled_from(["random", "peaked", "ties", "huge"]), st.integers(0, 2**32 - 1),
       st.booleans())
def test_sessions_are_bitwise_the_same_with_and_without_the_cache(rows, family, seed,
                                                                  prefetch):
    """Property: token ids, logprobs and status of a session of grammar and free rows
    (rows of one grammar often in one state) are the same bits with the mask cache on
    (with or without prefetch) and off."""
    seen = {}
    for cache in (True, False):
        vocab = _session_vocab(cache)
        batch = SamplingBatch.from_requests(grammar_requests(rows, GRAMMARS), vocab_size=512,
                                            vocab=vocab)
        sampler = Sampler()
        seen[cache] = random_session(sampler, batch, 512, seed, family, 8,
                                     prefetch=prefetch and cache)
        sampler.grammar_masker.close()
    same_steps(seen[True], seen[False])


def test_a_naming_failure_never_fails_the_grammar(monkeypatch):
    """Bug pinned: an exception while naming states (here a broken reader) failed the
    compilation, so the request, although xgrammar compiled its grammar."""
    from detsample.grammar import compiler as compiler_mod

    def broken(*a, **k):
        raise ValueError("reader bug")
    monkeypatch.setattr(compiler_mod, "grammar_source", broken)
    vocab = Vocabulary.default()
    g = RequestGrammar.submit("n", "json_schema", OBJ, vocab)
    out = generate(vocab, [g], seed=0, max_steps=300)
    assert not g.failed and g._keys is None and out[0]
    vocab.grammar_compiler.close()
