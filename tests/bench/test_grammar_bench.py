"""Benchmark: grammar cost per decode step (bitmask fill + apply + matcher advance).

Opt-in: ``python -m pytest tests/bench/test_grammar_bench.py --benchmark-enable -m bench -s``.
Prints a markdown table (copied into docs/perf/grammar.md). No timed assertions.

Per (B, V): a synthetic vocabulary (the default 512 tokens extended with seeded random
byte strings), B requests under one JSON schema (one compilation, B matchers). Each step:
seeded random logits -> grammar mask -> greedy pick -> matchers advance; a terminated
grammar is replaced by a fresh one (a cache hit) so B stays constant. Reported medians:
``fill`` (xgrammar bitmask fill, parallel across rows), ``mask`` (unpack + -inf select,
which also replaces the sampler's clone), ``accept`` (matcher advance), and ``sampler
+grammar`` vs ``sampler free``: the end-to-end Sampler.sample difference.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time

import pytest
import torch

from detsample import Request, Sampler, SamplingBatch, SamplingParams, Vocabulary
from detsample.grammar import GrammarMasker, RequestGrammar
from detsample.ops.mask import masked_logits

pytestmark = pytest.mark.bench

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "pattern": "^[a-z ]{1,40}$"},
                         "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string",
                                                            "pattern": "^[a-z]{1,8}$"},
                                  "maxItems": 8}},
          "required": ["name", "age", "tags"]}
CASES = [(b, v) for v in (32000, 152064) for b in (1, 16, 64)]
STEPS = 40
_ALPHA = b"abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789{}[]\":,._-"
_VOCABS: dict[int, Vocabulary] = {}


def synthetic_vocab(v: int, seed: int = 0) -> Vocabulary:
    """The default vocabulary extended to ``v`` tokens with distinct random byte strings."""
    if v not in _VOCABS:
        rng = random.Random(seed)
        toks = list(Vocabulary.default().tokens)
        seen = set(toks)
        while len(toks) < v:
            t = bytes(rng.choice(_ALPHA) if rng.random() < 0.9 else rng.randrange(256)
                      for _ in range(rng.randint(2, 10)))
            if t not in seen:
                seen.add(t)
                toks.append(t)
        _VOCABS[v] = Vocabulary.from_tokens(toks, eos_token_ids=[0])
    return _VOCABS[v]


def _med_ms(xs):
    return statistics.median(xs) * 1e3


@pytest.fixture(autouse=True)
def _opt_in(request):
    """Opt-in; torch intra-op threads pinned (DETSAMPLE_BENCH_THREADS, default 1: on a
    shared 2-core host, OpenMP barriers under load cost more than they save)."""
    if not request.config.getoption("benchmark_enable", default=False):
        pytest.skip("opt-in benchmark: pass --benchmark-enable")
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("DETSAMPLE_BENCH_THREADS", "1")))
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("b,v", CASES)
def test_grammar_step_cost(b, v, benchmark):
    vocab = synthetic_vocab(v)
    vocab.grammar_compiler.compile("json_schema", json.dumps(SCHEMA), timeout=600)
    compile_s = vocab.grammar_compiler.stats.compile_seconds[0]  # first (only) compilation
    grammars = [RequestGrammar.submit(f"r{i}", "json_schema", SCHEMA, vocab) for i in range(b)]
    masker = GrammarMasker()
    gen = torch.Generator().manual_seed(0)
    fill, mask, accept = [], [], []
    for _ in range(STEPS):
        logits = torch.randn(b, v, generator=gen)
        t0 = time.perf_counter()
        bm, rows = masker.fill(grammars, v)
        t1 = time.perf_counter()
        x = masked_logits(logits, bm, rows, limit=v)
        t2 = time.perf_counter()
        toks = x.argmax(1).tolist()
        t3 = time.perf_counter()
        for r in rows:
            grammars[r].accept_token(toks[r])
        t4 = time.perf_counter()
        fill.append(t1 - t0)
        mask.append(t2 - t1)
        accept.append(t4 - t3)
        for i, g in enumerate(grammars):
            if g.is_terminated():
                grammars[i] = RequestGrammar.submit(f"r{i}", "json_schema", SCHEMA, vocab)

    # End to end: the same Sampler with and without grammar rows.
    def batch(with_grammar: bool) -> SamplingBatch:
        reqs = [Request(rid=f"q{i}", params=SamplingParams(
            seed=i, json_schema=SCHEMA if with_grammar else None), prompt_ids=[1])
            for i in range(b)]
        return SamplingBatch.from_requests(reqs, vocab_size=v, vocab=vocab)

    ends = {}
    for with_grammar in (False, True):
        bt, s, times = batch(with_grammar), Sampler(), []
        for _ in range(STEPS):
            logits = torch.randn(b, v, generator=gen)
            pos = torch.tensor([len(o) for o in bt.output_ids])
            t0 = time.perf_counter()
            out = s.sample(logits, bt, pos)
            bt.advance(out.token_ids)
            times.append(time.perf_counter() - t0)
            done = [i for i, f in enumerate(bt.finished) if f is not None]
            if done:  # keep B rows: restart finished requests
                bt.filter([i for i in range(len(bt)) if i not in done])
                bt.merge(SamplingBatch.from_requests(
                    [Request(rid=f"n{i}", params=SamplingParams(seed=i, json_schema=SCHEMA),
                             prompt_ids=[1]) for i in done], vocab_size=v, vocab=vocab))
        ends[with_grammar] = _med_ms(times)
    row = (f"| {b} | {v} | {compile_s:.2f} | {_med_ms(fill):.2f} | {_med_ms(mask):.2f} | "
           f"{_med_ms(accept):.2f} | {_med_ms(fill) + _med_ms(mask) + _med_ms(accept):.2f} | "
           f"{ends[False]:.2f} | {ends[True]:.2f} | {ends[True] - ends[False]:+.2f} |")
    print(f"\n{row}  (torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f})")
    benchmark.extra_info.update(fill_ms=_med_ms(fill), mask_ms=_med_ms(mask),
                                accept_ms=_med_ms(accept), sampler_free_ms=ends[False],
                                sampler_grammar_ms=ends[True])
    benchmark.pedantic(lambda: masker.fill(grammars, v), rounds=5, iterations=1)
