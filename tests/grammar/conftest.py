"""Shared helpers for grammar tests: seeded random-logit generation under grammars."""

import numpy as np
import pytest
import torch

from detsample import Request, Vocabulary
from detsample.grammar import GrammarMasker, RequestGrammar
from detsample.grammar.compiler import GrammarCompiler
from detsample.grammar.config import GrammarConfig
from tests.helpers import logits_rows


def verifying(vocab, **kw):
    """``vocab`` with a grammar compiler whose mask cache is checked against a fresh
    xgrammar fill on every copied row (a difference raises GrammarError). Names are
    built with the compilation and every named state's first row is kept
    (``mask_cache_policy="eager"``) unless ``kw`` says otherwise, so every step after
    a state's first is a checked copy."""
    kw = {"verify_mask_cache": True, "mask_cache_policy": "eager", **kw}
    vocab._compiler = GrammarCompiler(vocab, GrammarConfig(**kw))
    return vocab


def generate(vocab, grammars, *, seed=0, max_steps=400, scale=3.0, until_done=True):
    """Sample from seeded random logits masked by each grammar until every grammar
    terminates (or fails). Returns the token lists; a grammar still active after
    ``max_steps`` is a test failure (``until_done=False``: just ``max_steps`` steps)."""
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
    if not until_done:
        return outs
    raise AssertionError(f"grammars still active after {max_steps} steps: {grammars}")


def grammar_requests(rows, grammars) -> list:
    """Requests ``r0, r1, ...`` from ``(params, i)`` pairs: ``grammars[i]`` is None (a free
    row) or the ``(kind, value)`` set on the params."""
    reqs = []
    for i, (p, g) in enumerate(rows):
        if grammars[g] is not None:
            kind, value = grammars[g]
            p = p.replace(**{kind: value})
        reqs.append(Request(f"r{i}", p, prompt_ids=[1]))
    return reqs


def random_session(
    sampler,
    batch,
    vocab_size: int,
    seed: int,
    family: str,
    steps: int,
    *,
    rescore: bool = False,
    prefetch: bool = False,
) -> list[tuple]:
    """Sample and advance ``batch`` on seeded ``logits_rows`` of ``family`` until every row
    finished or ``steps`` steps. Returns each step's ``(token_ids, logprobs, status)``,
    with ``rescore`` also ``compute_logprobs`` of the tokens and the top-logprob values;
    ``prefetch``: ``sampler.prefetch_grammar`` after each advance."""
    rng, seen = np.random.default_rng(seed), []
    for _ in range(steps):
        if all(f is not None for f in batch.finished):
            break
        x = torch.from_numpy(logits_rows(rng, len(batch), vocab_size, family))
        pos = torch.tensor([len(o) for o in batch.output_ids])
        out = sampler.sample(x, batch, pos)
        step = (out.token_ids, out.logprobs, out.status)
        if rescore:
            step += (
                sampler.compute_logprobs(x, batch, out.token_ids),
                None if out.top_logprobs is None else out.top_logprobs[0],
            )
        seen.append(step)
        batch.advance(out.token_ids)
        if prefetch:
            sampler.prefetch_grammar(batch)
    return seen


def same_steps(a, b) -> None:
    """Assert two sessions' step outputs are the same bits (floats compared as int32)."""
    assert len(a) == len(b)
    for step, (x, y) in enumerate(zip(a, b)):
        for u, v in zip(x, y):
            if u is None or v is None:
                assert u is v, step
            elif u.dtype.is_floating_point:
                assert torch.equal(u.view(torch.int32), v.view(torch.int32)), step
            else:
                assert torch.equal(u, v), step


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

    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False).compile_grammar(grammar)

    def accepts(data) -> bool:
        m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        return m.accept_string(data) and m.is_terminated()

    return accepts
