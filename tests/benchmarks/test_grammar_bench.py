"""Benchmark: what JSON-schema rows add to a sampling step (detsample/benchmarks/grammar.py).

Opt-in: ``DETSAMPLE_BENCH_THREADS=2 python -m pytest tests/benchmarks/test_grammar_bench.py -m bench
--benchmark-enable -s``. Prints markdown rows (copied into docs/perf/grammar.md and
docs/performance.md). No timed assertions.

``test_grammar_stage_costs`` prints the per-stage CPU time of each case at 1 thread.

Per case: two vocabularies of V = 152064 tokens (BPE-like; digit/punctuation-heavy), two
schemas (an array of integers; a tool call with an enum, a bounded string, a bounded
integer and a boolean), B in (16, 64); the grammar batch with and without
``Sampler.prefetch_grammar`` (then a 20 ms idle pause stands for the model's forward on
an accelerator, and any wait for the fill after it is counted).
"""

from __future__ import annotations

import os

import pytest

from detsample.benchmarks.grammar import HEADER, STAGES, VOCABS, stage_costs, step_cost

pytestmark = pytest.mark.bench

V = 152064
CASES = [
    (vocab, schema, b, prefetch)
    for vocab in ("bpe_like", "digit_heavy")
    for schema in ("int_array", "tool_call")
    for b in (16, 64)
    for prefetch in (False, True)
]
_VOCABS: dict = {}


@pytest.fixture(autouse=True)
def _opt_in(request):
    if not request.config.getoption("benchmark_enable", default=False):
        pytest.skip("opt-in benchmark: pass --benchmark-enable")


@pytest.mark.parametrize("vocab,schema,b,prefetch", CASES)
def test_grammar_step_cost(vocab, schema, b, prefetch, benchmark):
    if vocab not in _VOCABS:
        _VOCABS[vocab] = VOCABS[vocab](V)
    threads = int(os.environ.get("DETSAMPLE_BENCH_THREADS", "2"))
    steps = 30 if vocab == "bpe_like" else 20
    cost = step_cost(
        _VOCABS[vocab],
        vocab,
        schema,
        b,
        steps=steps,
        threads=threads,
        prefetch=prefetch,
        forward_ms=20.0 if prefetch else 0.0,
    )
    if (vocab, schema, b, prefetch) == CASES[0]:
        print("\n" + HEADER)
    print(f"{cost.row()}  (load {os.getloadavg()[0]:.1f})")
    benchmark.extra_info.update(wall=cost.wall, cpu=cost.cpu, ratio=cost.ratio, cpu_ratio=cost.cpu_ratio)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


@pytest.mark.parametrize("vocab,schema,b", sorted({c[:3] for c in CASES}))
def test_grammar_stage_costs(vocab, schema, b, benchmark):
    """Per-stage CPU time at 1 thread (cProfile): what the grammar rows spend and what
    the full-vocabulary steps they skip cost the free rows."""
    if vocab not in _VOCABS:
        _VOCABS[vocab] = VOCABS[vocab](V)
    cost = stage_costs(_VOCABS[vocab], schema, b)
    cells = " ".join(
        f"{k}: step {d['step']:.2f}, " + ", ".join(f"{s} {d[s]:.2f}" for s in STAGES if d[s]) for k, d in cost.items()
    )
    print(f"\nstages {vocab} {schema} B={b}: {cells}  (load {os.getloadavg()[0]:.1f})")
    benchmark.extra_info.update(stages=cost)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
