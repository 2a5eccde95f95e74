"""Tensor-parallel step times against TP=1, and the exact combine against torch's all-reduce.

Workloads (docs/performance.md, "Tensor parallelism"), as in
:mod:`detsample.benchmarks.invariant`: a prefill of ``prefill_len`` tokens at batch 1 and
one decode step at batch ``decode_batch`` over caches of ``cache_len`` tokens, through the
sharded model's adapter on every rank of a local gloo group (:func:`detsample.parallel.tp_group`,
one intra-op thread per rank). TP=1 is a group of one rank (the same code, no collective).
Sides: ``default`` (torch's kernels, a float all-reduce in the row-parallel layers) and
``portable`` (``batch_invariant(portable=True)``: the exact split-K combine). Each figure is
rank 0's best wall time over ``rounds`` (the ranks start each round together, after a
barrier). Models: ``hf-tiny-llama``, ``wide`` (the Llama of hidden 1024, 8 layers, of
:data:`detsample.benchmarks.invariant.WIDE`) and ``moe`` (a tiny Qwen3-MoE, :data:`MOE`:
its experts placed on ranks). ``--repeats R`` runs the TP sizes interleaved (1, 2, 1, 2, ...)
R times, each in a fresh group, and prints every repeat: on a shared machine the spread
between repeats is the noise of the figure.

:func:`combine_cost` isolates one row-parallel layer of the wide model at the prefill's
shape (``M = prefill_len`` rows, ``K = 1024 / tp`` per rank, ``N = 1024``): torch's
``all_reduce`` of the float32 partial output, against the exact combine's collectives (MAX
of the row maxima, int64 SUM of the partial integer sums) and against the whole
portable split product.

On a machine with fewer cores than ranks the ranks share cores: TP > 1 is then slower than
TP=1 by construction, and the figures measure overheads, not a speed-up.

Run: ``python -m detsample.benchmarks.tensor_parallel [--models ...] [--tp 1,2,4] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from detsample.benchmarks.invariant import WIDE

MODELS = {
    "hf-tiny-llama": "hf-tiny-llama",
    "wide": "detsample.benchmarks.tensor_parallel:wide_llama",
    "moe": "detsample.benchmarks.tensor_parallel:tiny_moe",
}
#: the tiny Qwen3-MoE of ``moe``: 4 layers of width 256, 8 experts of 256 features, 2 a token
MOE = dict(
    vocab_size=512,
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=256,
    intermediate_size=512,
    max_position_embeddings=1024,
)
SIDES = ("default", "portable")


def wide_llama() -> Any:
    """The wide Llama (a ``module:factory`` the ranks import)."""
    from detsample.models.tiny import build_hf

    return build_hf("llama", 0, **WIDE)


def tiny_moe() -> Any:
    """The tiny Qwen3-MoE of :data:`MOE` with seeded weights (a ``module:factory``)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from detsample.models.tiny import seeded_init_

    with torch.random.fork_rng(devices=[]):
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**MOE))
    return seeded_init_(model, 0).eval()


def _clone(cache: Any) -> Any:
    out = type(cache)()
    out.token_ids = list(cache.token_ids)
    out.layers = list(cache.layers)
    return out


def _timed(comm: Any, fn: Any) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of ``fn()`` started with the other ranks: rank-local wall
    time, and the CPU time of every rank's process summed over the ranks (all threads;
    on a loaded machine the CPU time is the steadier measure of the work)."""
    comm.barrier()
    t, c = time.perf_counter(), time.process_time()
    fn()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    total = sum(float(x) for x in comm.gather(torch.tensor([cpu], dtype=torch.float64)))
    return wall, total


def job_steps(
    lm: Any, comm: Any, prefill_len: int, decode_batch: int, cache_len: int, rounds: int, seed: int
) -> dict[str, float]:
    """Best prefill and decode seconds on this rank (rank 0's are the result), and the
    best ``cpu_prefill`` / ``cpu_decode``: CPU seconds summed over the ranks."""
    g = torch.Generator().manual_seed(seed)
    V = lm.vocab_size
    prompt = torch.randint(0, V, (prefill_len,), generator=g).tolist()
    rows = [torch.randint(0, V, (cache_len,), generator=g).tolist() for _ in range(decode_batch)]
    step = [[int(t)] for t in torch.randint(0, V, (decode_batch,), generator=g)]
    caches = [lm.new_cache() for _ in rows]
    lm.forward(caches, rows)  # caches and a warm-up
    lm.forward([lm.new_cache()], [prompt])
    best = dict.fromkeys(("prefill", "decode", "cpu_prefill", "cpu_decode"), float("inf"))
    for _ in range(rounds):
        runs = {"prefill": lambda: lm.forward([lm.new_cache()], [prompt])}
        cs = [_clone(c) for c in caches]
        runs["decode"] = lambda: lm.forward(cs, step)
        for name, fn in runs.items():
            wall, cpu = _timed(comm, fn)
            best[name] = min(best[name], wall)
            best[f"cpu_{name}"] = min(best[f"cpu_{name}"], cpu)
    return best


def job_combine(lm: Any, comm: Any, rows: int, hidden: int, rounds: int) -> dict[str, float]:
    """One row-parallel layer at ``rows x (hidden / world) -> hidden``: torch's all_reduce
    of the float partial, the exact combine's collectives, and the portable split product."""
    from detsample.invariant import batch_invariant
    from detsample.invariant.sharded import split_k_fixed_b, split_k_matmul

    g = torch.Generator().manual_seed(comm.rank)
    k = hidden // comm.world
    a = torch.randn(rows, k, generator=g)
    w = torch.randn(k, hidden, generator=g) * 0.05
    fb = split_k_fixed_b(w, comm.reduce)
    partial = a @ w
    s = torch.zeros(rows, hidden, dtype=torch.int64)
    top = torch.zeros(rows, 1, dtype=torch.float64)

    def float_reduce():
        comm.float_sum_(partial.clone())

    def exact_collectives():
        comm.max_(top.clone())
        comm.sum_(s.clone())

    def split_product():
        with batch_invariant(portable=True):
            split_k_matmul(a, fb, comm.reduce)

    def blas_plus_reduce():
        p = a @ w
        comm.float_sum_(p)

    out = {}
    for name, fn in (
        ("torch all_reduce (float32 partial)", float_reduce),
        ("exact combine collectives (float64 MAX of the row maxima, int64 SUM)", exact_collectives),
        ("default layer: BLAS partial + all_reduce", blas_plus_reduce),
        ("portable layer: split-K correctly rounded product", split_product),
    ):
        fn()
        best = float("inf")
        for _ in range(rounds):
            comm.barrier()
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        out[name] = best
    return out


def steps(
    model: str,
    tp: int,
    side: str,
    *,
    prefill_len: int = 512,
    decode_batch: int = 8,
    cache_len: int = 256,
    rounds: int = 3,
    seed: int = 0,
    timeout: float = 1800,
    start_method: str = "spawn",
) -> dict[str, float]:
    """Best prefill and decode seconds of ``model`` at ``tp`` ranks on ``side``."""
    from detsample.parallel import TPModelSpec, tp_group

    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    portable = side == "portable"
    spec = TPModelSpec(MODELS[model], tp, batch_invariant=portable, portable=portable)
    with tp_group(spec, timeout=timeout, start_method=start_method) as group:
        return group.call(job_steps, prefill_len, decode_batch, cache_len, rounds, seed)


def combine_cost(
    tp: int, *, rows: int = 512, hidden: int = 1024, rounds: int = 5, timeout: float = 900, start_method: str = "spawn"
) -> dict[str, float]:
    """Best seconds of each way to run one row-parallel layer (:func:`job_combine`)."""
    from detsample.parallel import RankGroup

    with RankGroup(tp, _no_model, (), timeout=timeout, start_method=start_method) as group:
        return group.call(job_combine, rows, hidden, rounds)


def _no_model(comm: Any) -> None:
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m detsample.benchmarks.tensor_parallel", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--tp", default="1,2,4", help="comma list of TP sizes")
    p.add_argument("--sides", nargs="+", default=list(SIDES), choices=list(SIDES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1, help="the TP sizes run interleaved this many times")
    p.add_argument("--prefill-len", type=int, default=512)
    p.add_argument("--decode-batch", type=int, default=8)
    p.add_argument("--cache-len", type=int, default=256)
    p.add_argument("--no-combine", action="store_true", help="skip the combine micro-benchmark")
    args = p.parse_args(argv)
    sizes = [int(t) for t in args.tp.split(",")]
    print(
        "| model | side | repeat | TP | prefill ms | decode ms | prefill vs TP=1 | decode vs TP=1 "
        "| prefill CPU ms (all ranks) | decode CPU ms | CPU prefill vs TP=1 | CPU decode vs TP=1 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models:
        for side in args.sides:
            for rep in range(args.repeats):
                base = None
                for tp in sizes:
                    t = steps(
                        model,
                        tp,
                        side,
                        prefill_len=args.prefill_len,
                        decode_batch=args.decode_batch,
                        cache_len=args.cache_len,
                        rounds=args.rounds,
                    )
                    base = base or t
                    cells = [f"{t[k] * 1e3:.1f}" for k in ("prefill", "decode")]
                    cells += [f"{t[k] / base[k]:.2f}x" for k in ("prefill", "decode")]
                    cells += [f"{t[k] * 1e3:.1f}" for k in ("cpu_prefill", "cpu_decode")]
                    cells += [f"{t[k] / base[k]:.2f}x" for k in ("cpu_prefill", "cpu_decode")]
                    print(f"| {model} | {side} | {rep} | {tp} | " + " | ".join(cells) + " |", flush=True)
    if not args.no_combine:
        print(f"\n| TP | row-parallel layer {args.prefill_len} x 1024/TP -> 1024 | ms |")
        print("|---|---|---|")
        for tp in [t for t in sizes if t > 1]:
            for name, sec in combine_cost(tp, rows=args.prefill_len, rounds=args.rounds).items():
                print(f"| {tp} | {name} | {sec * 1e3:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
