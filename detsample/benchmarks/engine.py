"""What a serving loop waits for: the refmodel engine's step time, sampler included.

A CPU twin (the same bits by a cheaper route for small batches) is worth its code only
where it shortens the ENGINE's step (the model's forward, the batch bookkeeping and the
sample), not the bare sampler call: the rule is a step at least 1.2x faster with the
twin than without. This benchmark runs :class:`detsample.refmodel.engine.Engine` over
the int64 reference model at a realistic vocabulary (V = 32000 by default), B requests
decoding together, and prints per (B, config) the median and the best step time over
the rounds (every round must draw the same tokens, which the run checks). A twin is
judged by running it on two checkouts, side by side (docs/performance.md).

    python -m detsample.benchmarks.engine [--batch 1,8] [--vocab 32000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from detsample.params import Request, SamplingParams
from detsample.probe.threads import torch_threads
from detsample.refmodel.config import RefModelConfig
from detsample.refmodel.engine import Engine, EngineConfig
from detsample.refmodel.model import RefModel
from detsample.refmodel.schedule import Schedule
from detsample.sampler import Sampler

CONFIGS = {
    "topk50_topp0.9_T0.8": dict(temperature=0.8, top_k=50, top_p=0.9),
    "topp0.9_T0.8": dict(temperature=0.8, top_p=0.9),
    "T0.8": dict(temperature=0.8),
}


def _schedule(B: int, config: str) -> Schedule:
    p = CONFIGS[config]
    return Schedule.of(
        (0, Request(f"r{i}", params=SamplingParams(seed=1000 + i, **p), prompt_ids=[1 + i, 2, 3, 4])) for i in range(B)
    )


def run_once(model: RefModel, B: int, config: str, steps: int) -> tuple[float, list]:
    """Seconds per engine step of one run, and every request's tokens."""
    eng = Engine(model, Sampler(), EngineConfig(max_batch_size=B, default_max_new_tokens=steps, eos_token_ids=()))
    sched = _schedule(B, config)
    t0 = time.perf_counter()
    res = eng.run(sched)
    dt = time.perf_counter() - t0
    return dt / steps, [res[f"r{i}"].token_ids for i in range(B)]


def measure(batches: list[int], vocab: int, rounds: int, steps: int) -> list[dict]:
    """Per (B, config): the median and the best engine step time over ``rounds`` runs
    (ms); raises when two runs draw different tokens."""
    model = RefModel(RefModelConfig(vocab_size=vocab, seed=0))
    rows = []
    for B in batches:
        for config in CONFIGS:
            times, ref = [], None
            for _ in range(rounds):
                t, toks = run_once(model, B, config, steps)
                if ref is not None and toks != ref:
                    raise AssertionError(f"two runs drew different tokens ({B}, {config})")
                ref = toks
                times.append(t)
            rows.append(dict(B=B, config=config, step_ms=statistics.median(times) * 1e3, best_ms=min(times) * 1e3))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=24, help="decode steps per request")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    with torch_threads(a.threads), torch.no_grad():
        rows = measure([int(b) for b in a.batch.split(",")], a.vocab, a.rounds, a.steps)
    print("| B | config | engine step ms (median) | best |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['B']} | {r['config']} | {r['step_ms']:.3f} | {r['best_ms']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
