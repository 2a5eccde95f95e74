"""Rollout throughput: the continuous-batching engine against a plain transformers ``generate`` loop.

A rollout of ``N`` sequences (prompts of ``--prompt-len`` tokens, ``--new-tokens`` sampled
each, no end token) through :class:`detsample.refmodel.engine.Engine` over the real-shape
model of :mod:`detsample.benchmarks.invariant` (``REAL``: a 135M-parameter Llama, 30
layers, hidden 576, vocabulary 49,152; seeded weights), every request waiting at step 0
and the engine admitting up to ``B`` at once (``--batch``); the same prompts through
``model.generate`` in batches of ``B`` (sampling, ``min_new_tokens`` = ``max_new_tokens``).
Prints tokens per second (wall), wall and process CPU seconds, and the engine's ratio to
``generate``; ``--sides`` adds the batch-invariant mode's variants on the engine side.

    python -m detsample.benchmarks.rollout [--batch 8 32] [--sequences 32] [--sides default verified]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from detsample.probe.threads import torch_threads

SIDES = ("default", "verified", "portable")


@dataclass(frozen=True)
class Run:
    """One measured rollout: ``label``, batch, tokens generated, wall and CPU seconds."""

    label: str
    batch: int
    tokens: int
    wall: float
    cpu: float

    @property
    def rate(self) -> float:
        return self.tokens / self.wall


def _timed(fn: Callable[[], int]) -> tuple[int, float, float]:
    w, c = time.perf_counter(), time.process_time()
    tokens = fn()
    return tokens, time.perf_counter() - w, time.process_time() - c


def prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()


def engine_rollout(lm: Any, prompt_ids: list[list[int]], batch: int, new_tokens: int) -> int:
    """Every prompt through the engine (all waiting at step 0, ``batch`` admitted at
    once); returns the tokens sampled."""
    from detsample.params import Request, SamplingParams
    from detsample.refmodel.engine import Engine, EngineConfig
    from detsample.refmodel.schedule import Schedule

    engine = Engine(lm, config=EngineConfig(max_batch_size=batch, eos_token_ids=()))
    reqs = [
        Request(f"r{i}", prompt_ids=p, params=SamplingParams(seed=i, max_new_tokens=new_tokens))
        for i, p in enumerate(prompt_ids)
    ]
    result = engine.run(Schedule.of((0, r) for r in reqs))
    return sum(len(r.token_ids) for r in result.results.values())


def generate_rollout(module: Any, prompt_ids: list[list[int]], batch: int, new_tokens: int) -> int:
    """The same prompts through transformers' ``generate`` in batches of ``batch``."""
    done = 0
    with torch.no_grad():
        for s in range(0, len(prompt_ids), batch):
            ids = torch.tensor(prompt_ids[s : s + batch])
            out = module.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
                eos_token_id=None,
            )
            done += (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return done


def measure(
    batches: tuple[int, ...], sequences: int, prompt_len: int, new_tokens: int, sides: tuple[str, ...]
) -> list[Run]:
    from detsample.benchmarks.invariant import REAL, build

    ps = prompts(sequences, prompt_len, REAL["vocab_size"])
    models = {side: build("real", side) for side in sides}
    runs = []
    for b in batches:
        got = _timed(lambda: generate_rollout(models[sides[0]].module, ps, b, new_tokens))
        runs.append(Run("transformers generate", b, *got))
        for side in sides:
            got = _timed(lambda side=side: engine_rollout(models[side], ps, b, new_tokens))
            runs.append(Run(f"engine ({side})", b, *got))
    return runs


def table(runs: list[Run]) -> str:
    base = {r.batch: r for r in runs if r.label == "transformers generate"}
    lines = [
        "| rollout | batch | tokens | wall (s) | CPU (s) | tokens / s | vs generate (wall) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        ratio = r.wall / base[r.batch].wall
        lines.append(
            f"| {r.label} | {r.batch} | {r.tokens} | {r.wall:.2f} | {r.cpu:.2f} | {r.rate:.1f} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m detsample.benchmarks.rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    p.add_argument("--sequences", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--sides", nargs="+", choices=SIDES, default=["default"])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    for name in ("sequences", "prompt_len", "new_tokens", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(b < 1 for b in args.batch):
        p.error(f"--batch sizes must be >= 1, got {args.batch}")
    with torch_threads(args.threads):
        runs = measure(tuple(args.batch), args.sequences, args.prompt_len, args.new_tokens, tuple(args.sides))
    print(table(runs))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
