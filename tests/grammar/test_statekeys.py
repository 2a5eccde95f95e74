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
from detsample.grammar.kinds import grammar_source
from detsample.grammar.statekeys import UNNAMED, StateKeys
from tests.helpers import params_strategy

from .conftest import generate, grammar_requests, random_session, same_steps

INT_ARRAY = {"type": "array", "items": {"type": "integer"}, "maxItems": 6}
OBJ = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}},
    "required": ["name", "n"],
}


def _with_config(vocab, **kw):
    vocab._compiler = GrammarCompiler(vocab, GrammarConfig(**{"mask_cache_policy": "eager", **kw}))
    return vocab


def _bytes_vocab():
    return Vocabulary.from_tokens(
        [b""] + [bytes([b]) for b in range(256)] + [b"\xc3\xa9", b"ab", b"\xc3"[:1] + b"a"], eos_token_ids=[0]
    )


def test_verify_catches_a_wrong_name(vocab, submit, monkeypatch):
    """Bug pinned: a name that does not change with the text (every state one name)
    copies the first row everywhere; the verifying fill must refuse it."""
    monkeypatch.setattr(StateKeys, "step", lambda self, sid, tid: sid)
    gs = [submit("json_schema", INT_ARRAY, rid=f"w{i}") for i in range(3)]
    with pytest.raises(GrammarError, match="cached bitmask row of state .* differs"):
        generate(vocab, gs, seed=1, max_steps=50)


def test_rows_in_one_state_are_filled_once_and_the_bits_are_xgrammars(vocab, submit, monkeypatch):
    gs = [submit("json_schema", OBJ, rid=f"s{i}") for i in range(6)]
    filled = []
    masker = GrammarMasker(parallel_min_rows=1)
    real = masker._fill_rows
    monkeypatch.setattr(
        masker,
        "_fill_rows",
        lambda role, th, grammars, bm, rows: (filled.append(list(rows)), real(role, th, grammars, bm, rows))[1],
    )
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
    compiler = GrammarCompiler(vocab, GrammarConfig(mask_cache_policy="eager"))
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


def test_every_grammar_shares_one_token_list():
    """Bug pinned: each grammar's names read ``TokenizerInfo.decoded_vocab``,
    which builds a new list of V bytes objects per read (~250 ms and ~18 MB at V = 128k,
    held by every grammar for good): the first step of every new schema paid it."""
    vocab = Vocabulary.from_tokens(
        [b"", b"<|sp|>"] + [bytes([b]) for b in range(256)], eos_token_ids=[0], special_ids=[1]
    )
    compiler = GrammarCompiler(vocab, GrammarConfig(mask_cache_policy="eager"))
    assert compiler.token_bytes() == vocab.xgrammar_tokenizer_info().decoded_vocab
    for text in ("[a-z]+", "[0-9]+"):
        compiler.compile("regex", text)
        assert compiler.state_keys("regex", text)._tokens is compiler.token_bytes()
    compiler.close()


def test_names_estimate_bounds_what_python_allocates():
    """The budget charges ``StateKeys.nbytes`` for a grammar's names: it must not be
    below what building them and naming states allocates (tracemalloc), nor far above."""
    import tracemalloc

    vocab = Vocabulary.default()
    compiler = GrammarCompiler(vocab, GrammarConfig(mask_cache_policy="eager"))
    texts = [json.dumps(OBJ), json.dumps(INT_ARRAY), "[a-z]{0,40}"]
    kinds = ["json_schema", "json_schema", "regex"]
    for k, t in zip(kinds, texts):  # warm up: imports, the token list, xgrammar's info
        compiler._build_keys(k, t)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        built = [compiler._build_keys(k, t) for k, t in zip(kinds, texts)]
        for keys in built:
            sid = keys.start
            for tid in vocab.encode('{"name": "abcdef", "n": 123}[1, 22, 333]' + "a" * 40):
                sid = keys.step(sid, tid) if sid != UNNAMED else keys.start
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    traced = sum(d.size_diff for d in after.compare_to(before, "filename"))
    estimate = sum(k.nbytes for k in built)
    assert traced <= estimate <= 3 * traced, (traced, estimate)
    compiler.close()


def test_a_grammar_seen_once_is_never_named():
    """The default policy: a grammar that does not recur costs xgrammar's own path (no
    NFA, no names, no rows), so a new schema's first step is not slower."""
    vocab = Vocabulary.default()
    g = RequestGrammar.submit("once", "json_schema", OBJ, vocab)
    out = generate(vocab, [g], seed=1, max_steps=300)
    c = vocab.grammar_compiler
    assert out[0] and c.stats.named == 0 and g._keys is None
    assert c.state_keys("json_schema", json.dumps(OBJ)) is None
    assert c.budget.stats().entries == {"compiled": 1, "names": 0, "row": 0}
    c.close()


def test_a_recurring_grammar_is_named_in_the_pool_and_adopted(monkeypatch):
    """A second request of a grammar names it, in a pool thread; a request that was
    already sampling adopts the names, its accepted text replayed through them, and from
    then on its copied rows are checked against xgrammar's fill."""
    threads = []
    real = StateKeys.build

    def spy(*a, **k):
        import threading

        threads.append(threading.current_thread().name)
        return real(*a, **k)

    monkeypatch.setattr(StateKeys, "build", spy)
    vocab = _with_config(Vocabulary.default(), verify_mask_cache=True, mask_cache_policy="recurring")
    a = RequestGrammar.submit("a", "json_schema", OBJ, vocab)
    generate(vocab, [a], seed=0, max_steps=3, until_done=False)
    assert a._keys is None and not threads
    b = RequestGrammar.submit("b", "json_schema", OBJ, vocab)
    keys = vocab.grammar_compiler.wait_names("json_schema", json.dumps(OBJ), timeout=30)
    assert keys is not None and threads and threads[0].startswith("detsample-grammar")
    ns = a.mask_state()
    assert ns is not None and ns[0] is keys
    sids = [keys.start]
    for tid in a.accepted:
        sids.append(keys.step(sids[-1], tid))
    assert a._sids == sids
    generate(vocab, [a, b], seed=0, max_steps=300)  # (verify_mask_cache on)
    assert keys.num_rows > 0
    vocab.grammar_compiler.close()


def test_rows_are_kept_only_for_states_that_recur():
    vocab = Vocabulary.default()
    width = (vocab.vocab_size + 31) // 32
    keys = StateKeys.build(
        grammar_source("regex", "[a-z]{0,10}", GrammarConfig()),
        vocab.tokens,
        vocab.eos_token_ids,
        width,
        keep_first=False,
    )
    s1 = keys.step(keys.start, ord("a") + 1)
    row = torch.arange(width, dtype=torch.int32)
    assert not keys.offer(keys.start, row) and keys.mask(keys.start) is None  # once
    assert keys.offer(keys.start, row)  # filled again: kept
    assert torch.equal(torch.from_numpy(keys.mask(keys.start).copy()), row)
    assert keys.offer(s1, row, recurs=True)  # two rows in it in one step: kept at once
    assert keys.num_rows == 2


def test_unexpandable_or_disabled_grammars_have_no_names(vocab):
    rec = {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}
    compiler = vocab.grammar_compiler
    compiler.compile("json_schema", json.dumps(rec))
    assert compiler.state_keys("json_schema", json.dumps(rec)) is None  # recursive
    off = _with_config(Vocabulary.default(), mask_cache=False)
    g = RequestGrammar.submit("o", "json_schema", OBJ, off)
    out = generate(off, [g], seed=0, max_steps=300)
    assert g._keys is None and g.mask_state() is None and out[0]


# -- property: whole sessions, cache on and off ----------------------------------------
GRAMMARS = [
    None,
    ("json_schema", OBJ),
    ("json_schema", INT_ARRAY),
    ("regex", "[a-z]{2,9}( [0-9]{1,3})?"),
    ("ebnf", 'root ::= "x" [0-9]* "."'),
]
_VOCABS: dict = {}


def _session_vocab(cache: bool) -> Vocabulary:
    if cache not in _VOCABS:
        _VOCABS[cache] = _with_config(Vocabulary.default(), mask_cache=cache)
    return _VOCABS[cache]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(params_strategy(512), st.sampled_from(range(len(GRAMMARS)))), min_size=1, max_size=6),
    st.sampled_from(["random", "peaked", "ties", "huge"]),
    st.integers(0, 2**32 - 1),
    st.booleans(),
)
def test_sessions_are_bitwise_the_same_with_and_without_the_cache(rows, family, seed, prefetch):
    """Property: token ids, logprobs and status of a session of grammar and free rows
    (rows of one grammar often in one state) are the same bits with the mask cache on
    (with or without prefetch) and off."""
    seen = {}
    for cache in (True, False):
        vocab = _session_vocab(cache)
        batch = SamplingBatch.from_requests(grammar_requests(rows, GRAMMARS), vocab_size=512, vocab=vocab)
        sampler = Sampler()
        seen[cache] = random_session(sampler, batch, 512, seed, family, 8, prefetch=prefetch and cache)
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
