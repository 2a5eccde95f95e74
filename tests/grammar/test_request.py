"""Tests of detsample/grammar/request.py: masks, accept, rollback, jump-forward, errors."""

import concurrent.futures as cf
import re
import threading

import pytest

from detsample import GrammarError, Vocabulary
from detsample.grammar import RequestGrammar
from detsample.grammar.masker import resolve_all
from detsample.ops.mask import allocate_token_bitmask, unpack_bitmask

WORDS = ["cat", "cats", "dog", "dogs", "the cat"]
REGEX = "cat|cats|dog|dogs|the cat"


def allowed_set(g, vocab):
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    assert g.fill_bitmask(bm, 0)
    return set(unpack_bitmask(bm, vocab.vocab_size)[0].nonzero().flatten().tolist())


def oracle_allowed(vocab, prefix: bytes):
    """Brute force over the finite language: tokens extending the prefix toward a word,
    plus EOS when the prefix is a complete word."""
    words = [w.encode() for w in WORDS]
    out = {
        t
        for t in range(vocab.vocab_size)
        if t not in vocab.special_ids and any(w.startswith(prefix + vocab.tokens[t]) for w in words)
    }
    if prefix in words:
        out |= set(vocab.eos_token_ids)
    return out


@pytest.mark.parametrize("path", [[], ["c"], ["c", "a"], ["c", "a", "t"], ["th", "e"], ["d", "o", "g", "s"]])
def test_mask_matches_brute_force_oracle(vocab, submit, path):
    g = submit("regex", REGEX)
    ids = [vocab.encode(p)[0] for p in path]
    for t in ids:
        g.accept_token(t)
    assert allowed_set(g, vocab) == oracle_allowed(vocab, vocab.decode(ids))


def test_rejected_token_names_request_and_prefix(vocab, submit):
    g = submit("regex", REGEX, rid="req-7")
    g.accept_token(vocab.encode("c")[0])
    with pytest.raises(
        GrammarError,
        match=r"request 'req-7'.*rejected token 121 \(b'x'\) "
        r"after accepted prefix b'c' \(1 tokens\)",
    ):
        g.accept_token(121)
    assert g.accepted == [vocab.encode("c")[0]] and g.is_active


def test_eos_terminates(vocab, submit):
    g = submit("regex", REGEX)
    for t in vocab.encode("dog"):
        g.accept_token(t)
    assert not g.is_terminated()
    g.accept_token(0)
    assert g.is_terminated() and not g.is_active
    with pytest.raises(GrammarError, match="already terminated"):
        g.accept_token(0)


def test_rollback_restores_earlier_mask(vocab, submit):
    g = submit("regex", REGEX)
    ids = [vocab.encode(c)[0] for c in "cats"] + [0]
    masks = []
    for t in ids:
        masks.append(allowed_set(g, vocab))
        g.accept_token(t)
    assert g.is_terminated()
    g.rollback(3)  # un-accept "t", "s", EOS
    assert g.is_active and g.accepted == ids[:2]
    assert allowed_set(g, vocab) == masks[2]
    g.rollback(0)
    assert g.accepted == ids[:2]
    with pytest.raises(GrammarError, match=r"rollback k must be in \[0, 2\], got 3"):
        g.rollback(3)


def test_jump_forward_from_start(vocab, submit):
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]+$"}}, "required": ["name"]}
    g = submit("json_schema", schema)
    rolled, new = g.jump_forward()
    assert rolled == 0 and new == vocab.encode('{"name": "')
    assert vocab.decode(g.accepted) == b'{"name": "'
    assert g.jump_forward() == (0, [])  # nothing forced inside the free string


def test_jump_forward_retokenises_and_rolls_back(vocab, submit):
    """The forced "he cat" after "t" re-tokenises as "th" "e" " " "c" "at": the matcher
    is rolled back past "t" and re-fed the new tokens."""
    g = submit("regex", "the cat")
    t = vocab.encode("t")[0]
    g.accept_token(t)
    rolled, new = g.jump_forward()
    assert rolled == 1 and new == vocab.encode("the cat") and new[0] != t
    assert g.accepted == vocab.encode("the cat")
    assert allowed_set(g, vocab) == set(vocab.eos_token_ids)


def test_initial_output_ids_are_fed(vocab):
    ids = vocab.encode("do")
    g = RequestGrammar.submit("r", "regex", REGEX, vocab, output_ids=ids)
    assert g.resolve() == "active" and g.accepted == ids
    assert allowed_set(g, vocab) == oracle_allowed(vocab, b"do")


def test_initial_output_ids_rejected_fail_request(vocab):
    g = RequestGrammar.submit("r9", "regex", REGEX, vocab, output_ids=vocab.encode("dx"))
    assert g.resolve() == "failed"
    assert re.search(r"request 'r9'.*rejected existing output token .*after accepted prefix b'd'", g.error)


BROKEN = [("json_schema", '{"type": "object", "properties": 5}'), ("regex", "(ab"), ("ebnf", "root ::= (")]


@pytest.mark.parametrize("kind,text", BROKEN)
def test_compile_failure_is_an_error_state(vocab, submit, kind, text):
    g = submit(kind, text, rid="bad")
    assert g.resolve() == "failed"
    assert g.error.startswith(f"request 'bad': {kind} grammar failed to compile: ")
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    assert not g.fill_bitmask(bm, 0) and bool((bm == -1).all())
    with pytest.raises(GrammarError, match="cannot accept a token: grammar is failed"):
        g.accept_token(1)


def test_timeout_is_an_error_state(vocab):
    never = cf.Future()
    g = RequestGrammar("slow", "regex", never, vocab, timeout_s=0.05)
    assert g.resolve() == "failed"
    assert g.error == "request 'slow': regex grammar did not compile within 0.05 s"


def test_no_timeout_waits_for_a_late_compilation(vocab):
    """``timeout_s=None`` (GrammarConfig(compile_timeout_s=None), the golden scenarios'):
    the step waits however long the compilation takes, alone or in a batch."""
    compiled = vocab.grammar_compiler.compile("regex", REGEX, timeout=30)

    def late() -> cf.Future:
        fut = cf.Future()
        threading.Timer(0.3, fut.set_result, [compiled]).start()
        return fut

    assert RequestGrammar("one", "regex", late(), vocab, timeout_s=None).resolve() == "active"
    fut = late()
    gs = [RequestGrammar(f"r{i}", "regex", fut, vocab, timeout_s=t) for i, t in enumerate((None, 0.05))]
    resolve_all(gs)
    assert [g.state for g in gs] == ["active", "active"]


def test_matchers_are_not_shared(vocab, submit):
    a, b = submit("regex", REGEX, rid="a"), submit("regex", REGEX, rid="b")
    assert a.future is b.future
    before = allowed_set(b, vocab)
    a.accept_token(vocab.encode("d")[0])
    assert allowed_set(b, vocab) == before != allowed_set(a, vocab)


def test_no_vocab_or_foreign_compiler_is_clear_error(vocab):
    with pytest.raises(GrammarError, match="has a regex grammar but the batch has no vocabulary"):
        RequestGrammar.submit("r", "regex", "a", None)
    other = Vocabulary.from_tokens([b""] + [bytes([b]) for b in range(256)], eos_token_ids=[0])
    with pytest.raises(GrammarError, match="compiler belongs to another vocabulary"):
        RequestGrammar.submit("r", "regex", "a", vocab, compiler=other.grammar_compiler)


def test_special_token_never_allowed_inside_grammar_text():
    """Bug pinned: a special token spelled like grammar text ("<pad>") must not be
    offered by the mask; the text is built from ordinary byte tokens."""
    toks = [b"<eos>", b"<pad>"] + [bytes([b]) for b in range(256)]
    v = Vocabulary.from_tokens(toks, eos_token_ids=[0], special_ids=[1])
    g = RequestGrammar.submit("sp", "regex", "<pad>|<eos>", v)
    allowed = allowed_set(g, v)
    assert allowed == {2 + ord("<")}
    for t in v.encode("<pad>"):
        assert 1 not in allowed_set(g, v)
        g.accept_token(t)
    assert allowed_set(g, v) == {0}
    g.accept_token(0)
    assert g.is_terminated()
    v.grammar_compiler.close()
