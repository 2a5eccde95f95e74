"""Shared helpers for grammar tests: seeded random-logit generation under grammars."""

import pytest
import torch

from detsample import Vocabulary
from detsample.grammar import GrammarMasker, RequestGrammar
from detsample.grammar.compiler import GrammarCompiler
from detsample.grammar.config import GrammarConfig


def verifying(vocab):
    """``vocab`` with a grammar compiler whose mask cache is checked against a fresh
    xgrammar fill on every copied row (a difference raises GrammarError)."""
    vocab._compiler = GrammarCompiler(vocab, GrammarConfig(verify_mask_cache=True))
    return vocab


def generate(vocab, grammars, *, seed=0, max_steps=400, scale=3.0):
    """Sample from seeded random logits masked by each grammar until every grammar
    terminates (or fails). Returns the token lists; a grammar still active after
    ``max_steps`` is a test failure."""
    gen = torch.Generator().manual_seed(seed)
    masker = GrammarMasker()
    outs = [[] for _ in grammars]
    for _ in range(max_steps):
        logits = torch.randn(len(grammars), vocab.vocab_size, generator=gen) * scale
        rows = masker.apply_(logits, grammars)
        if not rows:
            return outs
        probs = torch.softmax(logits, dim=-1)
        toks = torch.multinomial(probs, 1, generator=gen).flatten()
        for r in rows:
            grammars[r].accept_token(int(toks[r]))
            outs[r].append(int(toks[r]))
    raise AssertionError(f"grammars still active after {max_steps} steps: {grammars}")


@pytest.fixture
def vocab():
    v = verifying(Vocabulary.default())
    yield v
    v.grammar_compiler.close()


@pytest.fixture
def submit(vocab):
    def _submit(kind, value, rid="r", **kw):
        return RequestGrammar.submit(rid, kind, value, vocab, **kw)
    return _submit


def string_acceptor(grammar):
    """``accepts(data) -> bool``: whether ``grammar`` (an ``xgrammar.Grammar``) accepts
    the whole string or bytes ``data``. Compiled once, one fresh matcher per call."""
    import xgrammar as xgr

    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False
                                   ).compile_grammar(grammar)

    def accepts(data) -> bool:
        m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        return m.accept_string(data) and m.is_terminated()
    return accepts
