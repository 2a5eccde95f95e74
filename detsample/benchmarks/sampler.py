"""Sampler benchmarks shared by ``detsample bench`` and tests/bench (pytest-benchmark).

Median wall time over repeats, after a warm-up call, with an explicit torch thread
count (set and restored by :func:`threads`). Never used by tests as an assertion.
On ``device="cuda"`` each call is bracketed by ``torch.cuda.synchronize`` and the table
gains the torch backend on the GPU and a bare ``torch.log_softmax`` over the same
logits (the yardstick of docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from detsample.batch import SamplingBatch
from detsample.threads import torch_threads
from detsample.params import Request, SamplingParams
from detsample.sampler import Sampler

CONFIGS: dict[str, dict] = {
    "topk50_topp0.9_T0.8": dict(temperature=0.8, top_k=50, top_p=0.9),
    "T0.8": dict(temperature=0.8),
    "greedy": dict(temperature=0.0),
}


def threads(n: int | None):
    """Run with ``n`` torch intra-op threads (None: leave unchanged); restored after."""
    return torch_threads(n) if n else contextlib.nullcontext()


def median_ms(fn: Callable[[], object], repeat: int, device: str = "cpu") -> float:
    """Median ms of ``fn`` over ``repeat`` calls after one warm-up; on CUDA each call is
    synchronised before and after."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    fn()
    times = []
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


@dataclass(frozen=True)
class Case:
    B: int
    V: int
    config: str


def make_inputs(case: Case, seed: int = 0, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(case.B, case.V, generator=g) * 3).to(device)
    reqs = [Request(f"r{i}", SamplingParams(seed=i, **CONFIGS[case.config]))
            for i in range(case.B)]
    positions = torch.arange(case.B, dtype=torch.int64, device=device) + 100
    return logits, reqs, positions


def exponential_race(logits: torch.Tensor, batch: SamplingBatch, generator: torch.Generator
                     ) -> torch.Tensor:
    """The conventional engine path, for comparison only (not batch-invariant): softmax
    over the temperature-scaled logits, top-k/top-p by a sort (or a bounded topk), and
    ``argmax(p / Exp(1))`` noise from one generator for the whole batch."""
    z = logits / batch.temperatures.clamp(min=1e-6)
    flags = batch.flags
    ids = None
    if flags.need_top_k or flags.need_top_p:
        if flags.max_top_k is not None:
            z, ids = torch.topk(z, flags.max_top_k, dim=-1)
        else:
            z, ids = torch.sort(z, dim=-1, descending=True)
        pos = torch.arange(z.shape[1]).unsqueeze(0)
        z = z.masked_fill(pos >= batch.top_ks.unsqueeze(1).long(), float("-inf"))
    probs = torch.softmax(z, dim=-1)
    if flags.need_top_p:
        excl = probs.cumsum(-1) - probs
        probs = probs.masked_fill(excl >= batch.top_ps.unsqueeze(1).float(), 0.0)
    pick = (probs / torch.empty_like(probs).exponential_(generator=generator)).argmax(-1)
    return pick if ids is None else ids.gather(1, pick.unsqueeze(1)).squeeze(1)


def paths(case: Case, device: str = "cpu") -> dict[str, Callable[[], object]]:
    """The measured paths of one case, keyed by name."""
    logits, reqs, pos = make_inputs(case, device=device)
    batch = SamplingBatch.from_requests(reqs, case.V, device=device)
    det, fast = Sampler(), Sampler(deterministic=False)
    alone = [SamplingBatch.from_requests([r], case.V, device=device) for r in reqs]

    def loop():
        for i, b in enumerate(alone):
            det.sample(logits[i:i + 1], b, pos[i:i + 1])

    out = {
        "deterministic": lambda: det.sample(logits, batch, pos),
        "fast": lambda: fast.sample(logits, batch, pos),
        "per-request loop": loop,
    }
    if torch.device(device).type == "cuda":  # "deterministic" is the Triton backend there
        torch_backend = Sampler(backend="torch")
        out["torch backend"] = lambda: torch_backend.sample(logits, batch, pos)
        lsm_only = torch.empty_like(logits)
        out["bare log_softmax"] = lambda: torch.log_softmax(logits, -1, out=lsm_only)
    if case.config == "greedy":
        lsm = torch.empty_like(logits)
        out["bare argmax+log_softmax"] = lambda: (torch.argmax(logits, -1),
                                                  torch.log_softmax(logits, -1, out=lsm))
    else:
        out["exponential race (engine-style)"] = lambda: exponential_race(
            logits, batch, torch.Generator(device=device).manual_seed(0))
    return out


def run(batches=(1, 8, 64), vocabs=(32000, 152064), configs=tuple(CONFIGS),
        repeat: int = 7, n_threads: int | None = 2, skip_loop_above: int = 64,
        device: str = "cpu") -> list[dict]:
    rows = []
    digits = 3 if torch.device(device).type == "cuda" else 2
    with threads(n_threads):
        for V in vocabs:
            for B in batches:
                for cfg in configs:
                    case = Case(B, V, cfg)
                    for name, fn in paths(case, device).items():
                        if name == "per-request loop" and B > skip_loop_above:
                            continue
                        rows.append(dict(B=B, V=V, config=cfg, path=name, device=device,
                                         median_ms=round(median_ms(fn, repeat, device),
                                                         digits)))
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| V | B | config | path | median ms |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['V']} | {r['B']} | {r['config']} | {r['path']} | {r['median_ms']} |")
    return "\n".join(lines)
