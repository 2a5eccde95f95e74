"""Opt-in audit throughput benchmarks (tokens audited per second, one process):
``pytest tests/bench/test_audit_bench.py -m bench --benchmark-enable``.

Targets on the reference CPU (docs/perf/audit.md): >= 2 M tokens/s for NPZ and Parquet,
>= 0.5 M tokens/s for JSONL, on one core.
"""

from __future__ import annotations

import time

import pytest

from detsample.audit import audit
from detsample.audit.synth import synth_rollouts, write_jsonl, write_npz, write_parquet

FORMATS = [("npz", write_npz), ("parquet", write_parquet), ("jsonl", write_jsonl)]
MISMATCH_RATES = [0.0, 0.3, 1.0]


@pytest.fixture(scope="module")
def rollout_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("audit_bench")
    out = {}
    for rate in MISMATCH_RATES:
        cols = synth_rollouts(4000, seed=1, mean_len=256, prompt_len=128, mismatch_rate=rate)
        for name, writer in FORMATS:
            path = str(d / f"r{rate}.{name}")
            writer(cols, path)
            out[name, rate] = path
    return out


@pytest.mark.bench
@pytest.mark.parametrize("rate", MISMATCH_RATES)
@pytest.mark.parametrize("fmt", [f for f, _ in FORMATS])
def test_audit_throughput(benchmark, rollout_files, fmt, rate):
    path = rollout_files[fmt, rate]
    tokens = audit(path)["response_tokens"]
    cpu = []

    def run():
        t = time.process_time()
        audit(path)
        cpu.append(time.process_time() - t)

    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info["response_tokens"] = tokens
    benchmark.extra_info["M_tokens_per_s_cpu"] = tokens / min(cpu) / 1e6
    if benchmark.stats is not None:
        benchmark.extra_info["M_tokens_per_s_wall"] = tokens / benchmark.stats["min"] / 1e6
