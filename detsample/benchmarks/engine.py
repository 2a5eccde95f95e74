"""Does a CPU twin pay in an engine's step? The refmodel engine's loop with each twin off.

The sampler keeps a few CPU twins of its arithmetic -- the same bits by a cheaper route
for small batches: a row's filters and draw on Python scalars (``ops.hostcut.draw_one_row``,
up to ``hostcut.SCALAR_ROWS`` rows), Philox on Python ints for one row and in the 64-bit
lanes of one Python int for a few (``rng.HOST_INT_ROWS``, ``rng.HOST_LANE_ROWS``), and
the draw's CDF search on numpy (``ops.draw.draw_by_cdf`` vs its torch form). A twin is
worth its code only where it shortens what a serving loop waits for: the ENGINE's step
(the model's forward, the batch bookkeeping and the sample), not the bare sampler call.

This benchmark runs :class:`detsample.refmodel.engine.Engine` over the int64 reference
model at a realistic vocabulary (V = 32000 by default), B requests decoding together,
and times the whole run per engine step with all twins on and with each twin switched
off (module attributes swapped inside a ``try/finally``; the tokens are the same bits
either way, which the run checks). It prints, per (B, config), the step time and the
ratio "twin off / twin on": a twin pays where that ratio is at least 1.2.

    python -m detsample.benchmarks.engine [--batch 1,8] [--vocab 32000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Iterator

import torch

from detsample.ops import draw as draw_ops
from detsample.ops import hostcut
from detsample import rng
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

#: twin name -> (module, attribute, value that switches it off)
TWINS = {
    "python-scalar rows (hostcut.SCALAR_ROWS)": (hostcut, "SCALAR_ROWS", 0),
    "Philox on one Python int (rng.HOST_INT_ROWS)": (rng, "HOST_INT_ROWS", 0),
    "Philox in Python-int lanes (rng.HOST_LANE_ROWS)": (rng, "HOST_LANE_ROWS", 0),
    "numpy CDF search (draw.draw_by_cdf)": (draw_ops, "draw_by_cdf", draw_ops.draw_by_cdf_torch),
}


@contextlib.contextmanager
def twin_off(name: str | None) -> Iterator[None]:
    """Switch the named twin off for the block (None: every twin on)."""
    if name is None:
        yield
        return
    mod, attr, value = TWINS[name]
    old = getattr(mod, attr)
    setattr(mod, attr, value)
    try:
        yield
    finally:
        setattr(mod, attr, old)


def _schedule(B: int, config: str) -> Schedule:
    p = CONFIGS[config]
    return Schedule.of((0, Request(f"r{i}", params=SamplingParams(seed=1000 + i, **p),
                                   prompt_ids=[1 + i, 2, 3, 4]))
                       for i in range(B))


def run_once(model: RefModel, B: int, config: str, steps: int) -> tuple[float, list]:
    """Seconds per engine step of one run, and every request's tokens."""
    eng = Engine(model, Sampler(), EngineConfig(max_batch_size=B, default_max_new_tokens=steps,
                                                eos_token_ids=()))
    sched = _schedule(B, config)
    t0 = time.perf_counter()
    res = eng.run(sched)
    dt = time.perf_counter() - t0
    return dt / steps, [res[f"r{i}"].token_ids for i in range(B)]


def measure(batches: list[int], vocab: int, rounds: int, steps: int) -> list[dict]:
    model = RefModel(RefModelConfig(vocab_size=vocab, seed=0))
    rows = []
    variants = [None, *TWINS]
    for B in batches:
        for config in CONFIGS:
            times: dict = {v: [] for v in variants}
            ref = None
            for _ in range(rounds):  # round-robin: every variant sees the same load
                for v in variants:
                    with twin_off(v):
                        t, toks = run_once(model, B, config, steps)
                    if ref is None:
                        ref = toks
                    elif toks != ref:
                        raise AssertionError(f"twin {v!r} changed the tokens ({B}, {config})")
                    times[v].append(t)
            base = statistics.median(times[None])
            rows.append(dict(B=B, config=config, step_ms=base * 1e3,
                             ratios={v: statistics.median(times[v]) / base for v in TWINS}))
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
    names = list(TWINS)
    print("| B | config | engine step ms (all twins) | " +
          " | ".join(f"off: {n}" for n in names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for r in rows:
        print(f"| {r['B']} | {r['config']} | {r['step_ms']:.3f} | " +
              " | ".join(f"{r['ratios'][n]:.2f}x" for n in names) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
