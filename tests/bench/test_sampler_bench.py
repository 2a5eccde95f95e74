"""Opt-in sampler benchmarks: ``pytest tests/bench -m bench --benchmark-enable``."""

import pytest

from detsample.benchmarks import sampler as bm
CASES = [bm.Case(B, V, cfg) for V in (32000, 152064) for B in (1, 8, 64)
         for cfg in bm.CONFIGS]


@pytest.mark.bench
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"V{c.V}-B{c.B}-{c.config}")
@pytest.mark.parametrize("path", ["deterministic", "fast"])
def test_sampler(benchmark, case, path):  # noqa: D103
    fn = bm.paths(case)[path]
    with bm.threads(2):
        benchmark(fn)
