"""Speculative decoding on the reference engine: acceptance rate and time against the plain run.

B requests (temperature 0.8, top-p 0.9, seeded) decode ``--steps`` tokens each on the int64
reference model, once plainly and once per (draft, k) speculatively; every speculative
run's results are compared with the plain run's (tokens and logprob bits: it raises on a
difference). Drafts: ``same`` (the target model itself: it agrees at almost every draw),
``small`` (a 1-layer reference model of other weights: it rarely agrees) and ``ngram``
(prompt lookup, no model). Per row: the acceptance rate, the engine steps and the wall
time as ratios to the plain run (best of ``--rounds``; below 1 the speculative run is
faster).

    python -m detsample.benchmarks.speculative [--batch 4] [--steps 24] [--k 2,4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from detsample.params import Request, SamplingParams
from detsample.probe.threads import torch_threads
from detsample.refmodel.config import RefModelConfig
from detsample.refmodel.engine import Engine, EngineConfig
from detsample.refmodel.model import RefModel
from detsample.refmodel.schedule import Schedule
from detsample.refmodel.speculative import DraftModel, NGram, Speculative
from detsample.refmodel.verify import result_diff

DRAFTS = ("same", "small", "ngram")


def _schedule(B: int, steps: int) -> Schedule:
    return Schedule.of(
        (
            0,
            Request(
                f"r{i}",
                SamplingParams(seed=1000 + i, temperature=0.8, top_p=0.9, max_new_tokens=steps),
                prompt_ids=[1 + i, 2, 3, 4, 1 + i, 2],
            ),
        )
        for i in range(B)
    )


def _proposer(name: str, target: RefModel):
    if name == "same":
        return DraftModel(target)
    if name == "small":
        return DraftModel(RefModel(RefModelConfig(n_layers=1, seed=7)))
    if name == "ngram":
        return NGram()
    raise ValueError(f"draft must be one of {DRAFTS}, got {name!r}")


def _run(model: RefModel, sched: Schedule, spec: Speculative | None):
    eng = Engine(model, config=EngineConfig(eos_token_ids=()), speculative=spec)
    t0 = time.perf_counter()
    res = eng.run(sched)
    return time.perf_counter() - t0, res


def measure(B: int, steps: int, ks: list[int], drafts: list[str], rounds: int) -> list[dict]:
    """One row per (draft, k): acceptance rate, step ratio, time ratio (best of rounds,
    taken round-robin so that every variant sees the same machine load)."""
    model = RefModel()
    sched = _schedule(B, steps)
    variants = [None] + [(name, k) for name in drafts for k in ks]
    best: dict = {}
    runs: dict = {}
    for _ in range(rounds):
        for v in variants:
            spec = None if v is None else Speculative(_proposer(v[0], model), v[1])
            t, runs[v] = _run(model, sched, spec)
            best[v] = min(best.get(v, t), t)
    plain = runs[None]
    rows = []
    for v in variants[1:]:
        res = runs[v]
        for rid in plain.results:
            d = result_diff(plain[rid], res[rid])
            if d is not None:
                raise AssertionError(f"draft {v[0]!r}, k={v[1]}: {d}")
        s = res.speculative
        rows.append(
            dict(
                draft=v[0],
                k=v[1],
                acceptance=s.acceptance_rate,
                steps=s.steps / len(plain.steps),
                time=best[v] / best[None],
                plain_ms=best[None] * 1e3,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=24, help="tokens per request")
    ap.add_argument("--k", default="2,4")
    ap.add_argument("--drafts", default=",".join(DRAFTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    with torch_threads(a.threads), torch.no_grad():
        rows = measure(a.batch, a.steps, [int(k) for k in a.k.split(",")], a.drafts.split(","), a.rounds)
    print(f"plain run: {rows[0]['plain_ms']:.1f} ms (B={a.batch}, {a.steps} tokens each)")
    print("| draft | k | acceptance rate | engine steps / plain | time / plain |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['draft']} | {r['k']} | {r['acceptance']:.3f} | {r['steps']:.2f} | {r['time']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
