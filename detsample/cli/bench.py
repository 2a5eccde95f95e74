"""``detsample bench``: sampler timings (median ms) as a markdown table or JSON."""

from __future__ import annotations

import argparse
import json
import sys

from detsample.cli._argtypes import positive_int


def register(sub: argparse._SubParsersAction) -> None:
    from detsample.benchmarks.sampler import CONFIGS

    p = sub.add_parser("bench", help="benchmark the sampler (median ms per step)",
                       description="Time Sampler.sample (deterministic and fast mode) against "
                                   "baselines; prints a markdown table of median ms.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch", type=positive_int, nargs="+", default=[1, 8, 64], help="batch sizes")
    p.add_argument("--vocab", type=positive_int, nargs="+", default=[32000, 152064], help="vocab sizes")
    p.add_argument("--config", nargs="+", default=list(CONFIGS), choices=list(CONFIGS),
                   metavar="NAME", help=f"sampling configs: {', '.join(CONFIGS)}")
    p.add_argument("--repeat", type=positive_int, default=7, help="timed repeats per path")
    p.add_argument("--threads", type=positive_int, default=2, help="torch intra-op threads")
    p.add_argument("--quick", action="store_true", help="B=8, V=32000, 3 repeats (overrides --batch/--vocab/--repeat)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where the logits live (cuda: the Triton backend, synchronised "
                        "timings)")
    p.add_argument("--matmul", action="store_true",
                   help="(cuda) also time the batch-invariant matmul against cuBLAS")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from detsample.benchmarks import sampler as benchmark
    if args.device == "cuda" and not torch.cuda.is_available():
        print("detsample bench: error: --device cuda needs CUDA (torch.cuda.is_available() "
              "is False)", file=sys.stderr)
        return 2
    if args.matmul and args.device != "cuda":
        print("detsample bench: error: --matmul needs --device cuda", file=sys.stderr)
        return 2
    if args.quick:
        args.batch, args.vocab, args.repeat = [8], [32000], 3
    rows = benchmark.run(tuple(args.batch), tuple(args.vocab), tuple(args.config), args.repeat,
                         args.threads, device=args.device)
    print(benchmark.markdown(rows))
    report: dict | list = rows
    if args.matmul:
        from detsample.benchmarks import kernels
        mm_rows = kernels.matmul_rows(args.device)
        print()
        print(kernels.markdown(mm_rows))
        report = {"sampler": rows, "matmul": mm_rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0
