"""``detsample bench``: sampler timings (median ms) as a markdown table or JSON."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark the sampler (median ms per step)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64], help="batch sizes")
    p.add_argument("--vocab", type=int, nargs="+", default=[32000, 152064], help="vocab sizes")
    p.add_argument("--config", nargs="+", default=None,
                   help="configs: topk50_topp0.9_T0.8, T0.8, greedy (default: all)")
    p.add_argument("--repeat", type=int, default=7, help="timed repeats per path")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--quick", action="store_true", help="B=8, V=32000, 3 repeats")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from detsample import benchmark

    configs = tuple(args.config or benchmark.CONFIGS)
    for c in configs:
        if c not in benchmark.CONFIGS:
            print(f"unknown config {c!r}; choose from {list(benchmark.CONFIGS)}")
            return 2
    if args.quick:
        args.batch, args.vocab, args.repeat = [8], [32000], 3
    rows = benchmark.run(tuple(args.batch), tuple(args.vocab), configs, args.repeat, args.threads)
    print(benchmark.markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
