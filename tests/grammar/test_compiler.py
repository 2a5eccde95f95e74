"""Tests of detsample/grammar/compiler.py: cache keys, stats, failures, the pool."""

import threading

import pytest

from detsample import Vocabulary
from detsample.grammar import GrammarCompiler, GrammarConfig
from detsample.grammar import compiler as compiler_mod


def test_cache_hit_shares_future_and_counts(vocab):
    c = vocab.grammar_compiler
    f1 = c.submit("regex", "a+b")
    f2 = c.submit("regex", "a+b")
    assert f1 is f2
    f1.result(30)
    s = c.stats
    assert (s.hits, s.misses, s.failures, s.compiled) == (1, 1, 0, 1)
    assert s.total_compile_seconds > 0


def test_key_includes_kind_and_fingerprint(vocab):
    c = vocab.grammar_compiler
    assert c.submit("regex", 'root ::= "a"') is not c.submit("ebnf", 'root ::= "a"')
    assert c.key("regex", "x") == ("regex", "x", vocab.fingerprint)
    assert c.stats.misses == 2


def test_compiles_in_pool_thread_not_caller(vocab, monkeypatch):
    """Compilation must never run on the sampling (calling) thread."""
    seen = []
    real = compiler_mod.compile_kind

    def spy(*a):
        seen.append(threading.current_thread().name)
        return real(*a)

    monkeypatch.setattr(compiler_mod, "compile_kind", spy)
    vocab.grammar_compiler.compile("regex", "[0-9]+", timeout=30)
    assert seen and seen[0].startswith("detsample-grammar")
    assert seen[0] != threading.current_thread().name


@pytest.mark.parametrize(
    "kind,text",
    [
        ("regex", "(ab"),
        ("json_schema", "{not json"),
        ("ebnf", "root ::= undefined_rule"),
        ("structural_tag", '{"type": "nope"}'),
    ],
)
def test_failure_is_cached_and_counted(vocab, kind, text):
    c = vocab.grammar_compiler
    fut = c.submit(kind, text)
    with pytest.raises(Exception):
        fut.result(30)
    assert c.submit(kind, text) is fut
    s = c.stats
    assert (s.hits, s.misses, s.failures) == (1, 1, 1)


def test_user_owned_compiler_with_config():
    v = Vocabulary.default()
    with GrammarCompiler(v, GrammarConfig(max_workers=1, compile_timeout_s=5)) as c:
        assert c.compile("regex", "x", timeout=30) is not None
        assert c.cache_size() == 1
        c.clear_cache()
        assert c.cache_size() == 0
    assert v.grammar_compiler is not c


def test_grammar_cancelled_by_close_is_recompiled_on_next_submit(monkeypatch):
    """Bug pinned: close() cancels queued compilations, and their cancelled futures
    stayed in the cache, so every later request with that grammar failed ("compilation
    was cancelled") although the compiler reopens its pool on the next submit."""
    v = Vocabulary.default()
    gate = threading.Event()
    real = compiler_mod.compile_kind

    def slow(*a):
        gate.wait(30)
        return real(*a)

    monkeypatch.setattr(compiler_mod, "compile_kind", slow)
    c = GrammarCompiler(v, GrammarConfig(max_workers=1))
    running, queued = c.submit("regex", "a+"), c.submit("regex", "b+")
    c.close()
    gate.set()
    assert running.result(30) is not None and queued.cancelled()
    again = c.submit("regex", "b+")
    assert again is not queued and again.result(30) is not None
    assert c.submit("regex", "b+") is again  # cached from now on
    c.close()
