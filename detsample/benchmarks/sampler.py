"""Sampler benchmarks shared by ``detsample bench`` and tests/benchmarks (pytest-benchmark).

One case is (B, V, config, logits family). Every path of a case is timed in the same run,
round-robin (repeat r of every path before repeat r + 1 of any; each repeat in its own
shuffled order, seeded by r, so that no path always runs right after the same other path:
what ran just before a call, a sort that evicted the caches or a compiled kernel's
spinning threads, moves a sub-millisecond call by up to 1.5x; short cases get more
rounds, see :func:`round_robin_ms`), after a warm-up call, with
an explicit torch thread count (set and restored by :func:`threads`), so their ratios hold
even on a loaded machine. The median wall time is reported, and the number of torch
operator calls of one call (:func:`count_ops`). Never used by tests as an assertion.

Paths: ``detsample`` (``Sampler()``), ``detsample sort`` (``filter_impl="sort"``, the
reference semantics; filtered configs only), the peers' algorithms of
:mod:`detsample.benchmarks.peers`, and bare baselines (a stable sort of the scaled logits;
a bare ``log_softmax``, the yardstick of the bound "within 3x a log_softmax", as
called and into a reused buffer;
``argmax`` + ``log_softmax`` for greedy).

On ``device="cuda"`` each call is bracketed by ``torch.cuda.synchronize``; the peers'
CPU algorithms are left out, and the table gains the torch backend on the GPU and a bare
``torch.log_softmax`` over the same logits (the yardstick of docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from detsample.batch import SamplingBatch
from detsample.benchmarks import peers
from detsample.params import Request, SamplingParams
from detsample.probe.threads import torch_threads
from detsample.sampler import Sampler

CONFIGS: dict[str, dict] = {
    "topk50_topp0.9_T0.8": dict(temperature=0.8, top_k=50, top_p=0.9),
    "topp0.9_T0.8": dict(temperature=0.8, top_p=0.9),
    "minp0.1_T0.8": dict(temperature=0.8, min_p=0.1),
    "T0.8": dict(temperature=0.8),
    "greedy": dict(temperature=0.0),
}
LOGITS = ("peaked", "gaussian", "flat")

#: deterministic peers (reproducible for a seed) and non-reproducible shortcuts
DETERMINISTIC_PEERS = ("SGLang deterministic", "vLLM seeded")
SHORTCUT_PEERS = ("SGLang shortcut", "vLLM unseeded")
GREEDY_PEER = "SGLang / vLLM greedy"
#: the yardstick of the bound on a whole call ("within 3x a bare log_softmax"): a bare
#: ``torch.log_softmax(logits, -1)`` of the same logits, as a sampler calls it (a fresh
#: output each call: on CPU its page faults are a large part of it), and the same into a
#: reused buffer (what the pass alone costs), shown beside it
BARE_LOG_SOFTMAX = "bare log_softmax"
BARE_LOG_SOFTMAX_OUT = "bare log_softmax, reused out"


def threads(n: int | None):
    """Run with ``n`` torch intra-op threads (None: leave unchanged); restored after."""
    return torch_threads(n) if n else contextlib.nullcontext()


def median_ms(fn: Callable[[], object], repeat: int, device: str = "cpu") -> float:
    """Median wall time of ``fn`` in ms over ``repeat`` calls after one warm-up call; on
    CUDA each call is synchronised before and after."""
    return round_robin_ms({"fn": fn}, repeat, device)["fn"]


#: the most rounds ``min_seconds`` may ask for
MAX_REPEAT = 500


def round_robin_ms(
    fns: dict[str, Callable[[], object]],
    repeat: int,
    device: str = "cpu",
    stat: Callable = statistics.median,
    min_seconds: float = 0.0,
) -> dict[str, float]:
    """``stat`` (median) ms of each function, timed round-robin after one warm-up call
    each; repeat ``r`` runs the functions in the order of ``random.Random(r)``'s shuffle
    (the same orders in every run). At least ``repeat`` rounds, more when a round is
    short: enough for about ``min_seconds`` of timed calls (at most ``MAX_REPEAT``
    rounds), so sub-millisecond calls get hundreds of samples instead of a handful."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    for fn in fns.values():
        fn()
    sync()
    one_round = time.perf_counter() - t0
    if min_seconds > 0 and one_round > 0:
        repeat = max(repeat, min(MAX_REPEAT, math.ceil(min_seconds / one_round)))
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeat):
        order = list(fns)
        random.Random(r).shuffle(order)
        for k in order:
            fn = fns[k]
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[k].append(time.perf_counter() - t0)
    return {k: _scaled_ms(stat(v)) for k, v in times.items()}


def _scaled_ms(v):
    return tuple(x * 1e3 for x in v) if isinstance(v, tuple) else v * 1e3


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> int:
    """The number of torch operator calls (aten ops, as dispatched) of one call of ``fn``."""
    with _OpCounter() as c:
        fn()
    return c.count


@dataclass(frozen=True)
class Case:
    B: int
    V: int
    config: str
    logits: str = "peaked"


def make_logits(case: Case, seed: int = 0, device: str = "cpu") -> torch.Tensor:
    """(B, V) float32 logits of the case's family.

    ``gaussian``: N(0, 3^2) i.i.d. (a flat top: top-p 0.9 keeps thousands of tokens).
    ``flat``: N(0, 1) i.i.d. (a flat distribution, as at a high temperature: top-p 0.9 at
    T = 0.8 keeps about half the vocabulary).
    ``peaked``: N(0, 2^2) plus 24 random tokens per row lifted by 16 - 2 log2(rank + 1),
    a language-model-like head (the top token holds roughly half the mass; top-p 0.9 at
    T = 0.8 keeps a few to a few dozen tokens).
    """
    g = torch.Generator().manual_seed(seed)
    if case.logits in ("gaussian", "flat"):
        std = 3.0 if case.logits == "gaussian" else 1.0
        return (torch.randn(case.B, case.V, generator=g) * std).to(device)
    x = torch.randn(case.B, case.V, generator=g) * 2
    n = min(24, case.V)
    lift = 16.0 - 2.0 * torch.log2(torch.arange(n, dtype=torch.float32) + 1)
    for i in range(case.B):
        ids = torch.randperm(case.V, generator=g)[:n]
        x[i, ids] += lift
    return x.to(device)


def make_inputs(case: Case, seed: int = 0, device: str = "cpu"):
    logits = make_logits(case, seed, device)
    reqs = [Request(f"r{i}", SamplingParams(seed=i, **CONFIGS[case.config])) for i in range(case.B)]
    positions = torch.arange(case.B, dtype=torch.int64, device=device) + 100
    return logits, reqs, positions


def paths(
    case: Case, sglang_multinomial: Callable | None = None, fast: bool = False, device: str = "cpu"
) -> dict[str, Callable[[], object]]:
    """The measured paths of one case, keyed by name (see the module docstring).
    ``sglang_multinomial``: the seeded Gumbel-max SGLang deterministic path uses
    (:func:`peers.compiled_multinomial`; default the eager one). ``fast`` adds
    ``Sampler(deterministic=False)``."""
    logits, reqs, pos = make_inputs(case, device=device)
    batch = SamplingBatch.from_requests(reqs, case.V, device=device)
    det = Sampler()
    out = {"detsample": lambda: det.sample(logits, batch, pos)}
    if fast:
        quick = Sampler(deterministic=False)
        out["detsample fast"] = lambda: quick.sample(logits, batch, pos)
    if torch.device(device).type == "cuda":  # "detsample" is the Triton backend there
        torch_backend = Sampler(backend="torch")
        out["torch backend"] = lambda: torch_backend.sample(logits, batch, pos)
        lsm_only = torch.empty_like(logits)
        out[BARE_LOG_SOFTMAX] = lambda: torch.log_softmax(logits, -1, out=lsm_only)
        return out
    pb = peers.PeerBatch.of([r.params for r in reqs], pos, case.V)
    if case.config == "greedy":
        lsm = torch.empty_like(logits)
        out[GREEDY_PEER] = lambda: peers.greedy(logits, pb)
        out["bare argmax+log_softmax"] = lambda: (torch.argmax(logits, -1), torch.log_softmax(logits, -1, out=lsm))
        return out
    filtered = any(k in CONFIGS[case.config] for k in ("top_k", "top_p", "min_p"))
    if filtered:
        ref = Sampler(filter_impl="sort")
        out["detsample sort"] = lambda: ref.sample(logits, batch, pos)
    multinomial = sglang_multinomial or peers.multinomial_with_seed
    out["SGLang deterministic"] = lambda: peers.sglang_deterministic(logits, pb, multinomial)
    out["SGLang shortcut"] = lambda: peers.sglang_shortcut(logits, pb)
    out["vLLM seeded"] = lambda: peers.vllm_seeded(logits, pb)
    out["vLLM unseeded"] = lambda: peers.vllm_unseeded(logits, pb)
    if filtered:
        z = logits / pb.temperatures
        out["bare stable sort"] = lambda: torch.sort(z, dim=-1, descending=True, stable=True)
    lsm_only = torch.empty_like(logits)
    out[BARE_LOG_SOFTMAX] = lambda: torch.log_softmax(logits, -1)
    out[BARE_LOG_SOFTMAX_OUT] = lambda: torch.log_softmax(logits, -1, out=lsm_only)
    return out


def run(
    batches=(1, 8, 64),
    vocabs=(32000, 152064),
    configs=tuple(CONFIGS),
    repeat: int = 7,
    n_threads: int | None = 2,
    logits: str = "peaked",
    compile_sglang: bool = True,
    fast: bool = False,
    device: str = "cpu",
    min_seconds: float = 0.0,
) -> list[dict]:
    """One row per (V, B, config, path): median ms and torch ops per call
    (``repeat``, ``min_seconds``: as in :func:`round_robin_ms`)."""
    rows = []
    cuda = torch.device(device).type == "cuda"
    with threads(n_threads):
        multinomial, how = (
            peers.compiled_multinomial() if compile_sglang and not cuda else (peers.multinomial_with_seed, "eager")
        )
        for V in vocabs:
            for B in batches:
                for cfg in configs:
                    fns = paths(Case(B, V, cfg, logits), multinomial, fast, device)
                    both = round_robin_ms(fns, repeat, device, lambda v: (statistics.median(v), min(v)), min_seconds)
                    for name, fn in fns.items():
                        label = f"{name} ({how})" if name == "SGLang deterministic" else name
                        med, low = both[name]
                        rows.append(
                            dict(
                                B=B,
                                V=V,
                                config=cfg,
                                logits=logits,
                                path=label,
                                device=device,
                                median_ms=round(med, 4),
                                min_ms=round(low, 4),
                                ops=count_ops(fn),
                            )
                        )
    return rows


def _cell(r: dict | None, stat: str) -> str:
    return "" if r is None else f"{r[stat]:.3g}"


def markdown(rows: list[dict], stat: str = "median_ms") -> str:
    """One line per (V, B, config): every path's ``stat`` ("median_ms" or "min_ms"),
    detsample's op count, and detsample's time over the best deterministic peer and the
    best shortcut peer."""
    order: list[str] = []
    for r in rows:
        if r["path"] not in order:
            order.append(r["path"])
    head = (
        ["V", "B", "config", "detsample ops"]
        + order
        + ["detsample / best deterministic peer", "detsample / best shortcut peer", "detsample / bare log_softmax"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cases: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        cases.setdefault((r["V"], r["B"], r["config"]), {})[r["path"]] = r
    for (V, B, cfg), by in cases.items():
        det = by.get("detsample")
        cells = [str(V), str(B), cfg, str(det["ops"]) if det else ""]
        cells += [_cell(by.get(p), stat) for p in order]
        for group in (DETERMINISTIC_PEERS + (GREEDY_PEER,), SHORTCUT_PEERS + (GREEDY_PEER,)):
            best = [r[stat] for p, r in by.items() if p.split(" (")[0] in group]
            cells.append(f"{det[stat] / min(best):.2f}x" if det and best else "")
        bare = by.get(BARE_LOG_SOFTMAX) or by.get("bare argmax+log_softmax")
        cells.append(f"{det[stat] / bare[stat]:.2f}x" if det and bare else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
