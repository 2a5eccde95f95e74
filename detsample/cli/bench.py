"""``detsample bench``: sampler timings (median ms) as a markdown table or JSON."""

from __future__ import annotations

import argparse
import json

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
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from detsample.benchmarks import sampler as benchmark
    if args.quick:
        args.batch, args.vocab, args.repeat = [8], [32000], 3
    rows = benchmark.run(tuple(args.batch), tuple(args.vocab), tuple(args.config), args.repeat,
                         args.threads)
    print(benchmark.markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
