"""Opt-in reference-model benchmarks: ``pytest tests/benchmarks -m bench --benchmark-enable``."""

import random

import pytest

from detsample import Request, SamplingParams
from detsample.refmodel import RefModel
from detsample.refmodel.engine import Engine
from detsample.refmodel.schedule import Schedule
from tests.helpers import num_threads

MODEL = RefModel()
RNG = random.Random(0)


@pytest.mark.bench
@pytest.mark.parametrize("T", [16, 256, 1024])
def test_prefill(benchmark, T):  # noqa: D103
    ids = [RNG.randrange(512) for _ in range(T)]
    with num_threads(2):
        benchmark(MODEL.prefill, ids)


@pytest.mark.bench
@pytest.mark.parametrize("B", [1, 8, 32])
def test_decode_step(benchmark, B):  # noqa: D103
    caches = []
    for _ in range(B):
        c = MODEL.new_cache()
        MODEL.prefill([RNG.randrange(512) for _ in range(128)], c)
        caches.append(c)

    def step():
        clones = [c.clone() for c in caches]
        MODEL.decode(clones, [1] * B)

    with num_threads(2):
        benchmark(step)


@pytest.mark.bench
def test_engine_16_requests(benchmark):  # noqa: D103
    reqs = [
        Request(
            f"r{i}", SamplingParams(seed=i, max_new_tokens=32, top_p=0.9), [RNG.randrange(1, 512) for _ in range(32)]
        )
        for i in range(16)
    ]
    sched = Schedule.of([(i, r) for i, r in enumerate(reqs)])
    with num_threads(2):
        benchmark.pedantic(Engine(MODEL).run, args=(sched,), rounds=3, iterations=1)
