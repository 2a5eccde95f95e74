"""``detsample bench``: sampler timings against the peers' algorithms (median ms, torch
ops per call) as a markdown table or JSON."""

from __future__ import annotations

import argparse
import json
import sys

from detsample.cli._argtypes import finite_nonneg_float, positive_int, positive_int_list, thread_count
from detsample.cli._outputs import output_problem, write_output
from detsample.inputs import memory_problem


def register(sub: argparse._SubParsersAction) -> None:
    from detsample.benchmarks.sampler import CONFIGS, LOGITS

    p = sub.add_parser(
        "bench",
        help="benchmark the sampler against the peers (median ms)",
        description="Time Sampler.sample against re-implementations of the "
        "peers' CPU sampling algorithms (SGLang deterministic and "
        "shortcut, vLLM seeded and unseeded) and bare baselines, "
        "round-robin in one run; prints a markdown table of median "
        "ms with detsample's torch op count per call.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--batch",
        type=positive_int_list,
        nargs="+",
        default=[[1, 8, 64]],
        metavar="B[,B...]",
        help="batch sizes, e.g. 1,8,64",
    )
    p.add_argument(
        "--vocab", type=positive_int_list, nargs="+", default=[[32000, 152064]], metavar="V[,V...]", help="vocab sizes"
    )
    p.add_argument(
        "--config",
        nargs="+",
        default=list(CONFIGS),
        choices=list(CONFIGS),
        metavar="NAME",
        help=f"sampling configs: {', '.join(CONFIGS)}",
    )
    p.add_argument(
        "--logits",
        default="peaked",
        choices=LOGITS,
        help="logits family: peaked (language-model-like), gaussian (a flat top) or flat (a flat distribution)",
    )
    p.add_argument(
        "--repeat", type=positive_int, default=7, help="timed repeats per path (at least; see --min-seconds)"
    )
    p.add_argument(
        "--min-seconds",
        type=finite_nonneg_float,
        default=1.0,
        help="repeat a case's round until about this many seconds of calls are "
        "timed (at most 500 rounds): a sub-millisecond row gets hundreds "
        "of samples; 0: exactly --repeat",
    )
    p.add_argument(
        "--threads", type=thread_count, default=2, help="torch intra-op threads (at most 4 x this machine's CPUs)"
    )
    p.add_argument(
        "--no-compile", action="store_true", help="run SGLang's seeded Gumbel-max eagerly instead of torch.compile-d"
    )
    p.add_argument(
        "--stat",
        default="median",
        choices=["median", "min"],
        help="the statistic of the table (JSON rows hold both): the median, or "
        "the minimum, the uncontended cost on a loaded machine",
    )
    p.add_argument("--fast", action="store_true", help="also time Sampler(deterministic=False)")
    p.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="where the logits live (cuda: the Triton backend, synchronised timings, no CPU peers)",
    )
    p.add_argument("--matmul", action="store_true", help="(cuda) also time the batch-invariant matmul against cuBLAS")
    p.add_argument(
        "--quick",
        action="store_true",
        help="B=8, V=32000, 3 repeats, no compile, --min-seconds 0 (overrides those options)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from detsample.benchmarks import sampler as benchmark

    problem = output_problem(args.json, "--json")
    if problem:  # before the timings, not after them
        print(f"detsample bench: error: {problem}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("detsample bench: error: --device cuda needs CUDA (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    if args.matmul and args.device != "cuda":
        print("detsample bench: error: --matmul needs --device cuda", file=sys.stderr)
        return 2
    batches = [b for group in args.batch for b in group]
    vocabs = [v for group in args.vocab for v in group]
    if args.quick:
        batches, vocabs, args.repeat, args.no_compile = [8], [32000], 3, True
        args.min_seconds = 0.0
    too_big = memory_problem(
        4 * max(batches) * max(vocabs), f"--batch {max(batches)} x --vocab {max(vocabs)} float32 logits"
    )
    if too_big:
        print(f"detsample bench: error: {too_big}", file=sys.stderr)
        return 2
    rows = benchmark.run(
        tuple(batches),
        tuple(vocabs),
        tuple(args.config),
        args.repeat,
        args.threads,
        args.logits,
        not args.no_compile,
        args.fast,
        device=args.device,
        min_seconds=args.min_seconds,
    )
    print(benchmark.markdown(rows, f"{args.stat}_ms"))
    report: dict | list = rows
    if args.matmul:
        from detsample.benchmarks import kernels

        mm_rows = kernels.matmul_rows(args.device)
        print()
        print(kernels.markdown(mm_rows))
        report = {"sampler": rows, "matmul": mm_rows}
    if args.json:
        failed = write_output(args.json, json.dumps(report, indent=1), "--json")
        if failed:
            print(f"detsample bench: error: {failed}", file=sys.stderr)
            return 2
    return 0
