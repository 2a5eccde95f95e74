"""Opt-in sampler benchmarks: ``pytest tests/benchmarks -m bench --benchmark-enable``."""

import pytest

from detsample.benchmarks import sampler as bm

CASES = [bm.Case(B, V, cfg) for V in (32000, 152064) for B in (1, 8, 64) for cfg in bm.CONFIGS]


@pytest.mark.bench
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"V{c.V}-B{c.B}-{c.config}")
@pytest.mark.parametrize("path", ["detsample", "vLLM seeded"])
def test_sampler(benchmark, case, path):  # noqa: D103
    fns = bm.paths(case)
    if path not in fns:
        pytest.skip(f"{path} is not a path of {case.config}")
    with bm.threads(2):
        benchmark(fns[path])
