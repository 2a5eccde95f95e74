"""Opt-in: the batch-invariant mode against torch's default kernels (docs/performance.md,
"Batch-invariant mode"): ``pytest tests/bench/test_invariant_bench.py -m bench
--benchmark-enable`` or ``python -m detsample.benchmarks.invariant``.

Target: the mode at most 2x the default kernels for a 512-token prefill at batch 1 and a
decode step at batch 8 over 256-token caches, 2 threads, on hf-tiny-llama and a Llama of
hidden 1024 and 8 layers. Reported, never asserted.
"""

from __future__ import annotations

import pytest

from detsample.benchmarks.invariant import MODELS, measure


@pytest.mark.bench
@pytest.mark.parametrize("name", MODELS)
def test_mode_vs_default_kernels(benchmark, name):
    timings = benchmark.pedantic(lambda: measure(name, rounds=3), rounds=1, iterations=1)
    for t in timings:
        benchmark.extra_info[f"{t.workload}: default ms"] = round(1e3 * t.default_s, 2)
        benchmark.extra_info[f"{t.workload}: mode ms"] = round(1e3 * t.mode_s, 2)
        benchmark.extra_info[f"{t.workload}: ratio"] = round(t.ratio, 3)
