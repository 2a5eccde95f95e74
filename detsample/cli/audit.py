"""``detsample audit``: engine vs trainer logprob audit of RL rollouts, with gates.

Exit codes: 0 ok, 1 a gate failed (the metric is named), 2 bad input or usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from detsample.audit.readers import AuditInputError
from detsample.cli._argtypes import positive_int


def _fraction(text: str) -> float:
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return v


def _nonneg(text: str) -> float:
    v = float(text)
    if not v >= 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "audit", help="audit engine vs trainer logprobs of RL rollouts (JSONL/NPZ/Parquet)",
        description="Compare the logprobs an inference engine reported at sampling time with "
                    "the logprobs a trainer recomputes (d = trainer - engine, over the mask). "
                    "Metrics are defined in docs/audit.md.")
    p.add_argument("files", nargs="+", metavar="FILE", help=".jsonl, .npz or .parquet rollouts")
    p.add_argument("--json", metavar="PATH", help="write the JSON report here ('-' = stdout)")
    p.add_argument("--report", metavar="DIR", help="write index.html, PNG plots and report.json")
    p.add_argument("--strict", action="store_true",
                   help="fail (exit 2) at the first bad sequence instead of excluding it")
    p.add_argument("--workers", type=positive_int, default=1, metavar="N",
                   help="processes to shard the files over (same report for every N)")
    p.add_argument("--max-abs-diff", type=_nonneg, metavar="T",
                   help="gate: exit 1 when max |d| > T")
    p.add_argument("--min-exact-match", type=_fraction, metavar="F",
                   help="gate: exit 1 when the bitwise exact-match fraction < F")
    p.add_argument("--rescore", choices=["refmodel"],
                   help="recompute missing trainer_logprobs by prefill with this model")
    p.add_argument("--dtype", choices=["promoted", "float16", "float32", "float64"],
                   default="promoted",
                   help="round both logprob columns to this dtype before comparing "
                        "(default: the promoted dtype of the two columns)")
    p.add_argument("--quiet", action="store_true", help="no summary table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from detsample.audit import audit, check_gates, to_json
    from detsample.audit.report import format_summary, write_report

    try:
        report = audit(args.files, rescore=args.rescore, strict=args.strict,
                       workers=args.workers,
                       compare_dtype=None if args.dtype == "promoted" else args.dtype)
    except (AuditInputError, OSError) as exc:
        print(f"detsample audit: error: {exc}", file=sys.stderr)
        return 2
    text = to_json(report)
    if args.json == "-":
        sys.stdout.write(text)
    if not args.quiet:
        (sys.stderr if args.json == "-" else sys.stdout).write(format_summary(report))
    try:  # an unwritable output is exit 2, never the traceback exit 1 of a failed gate
        if args.json and args.json != "-":
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(text)
        if args.report:
            print(f"report: {write_report(report, args.report)}", file=sys.stderr)
    except OSError as exc:
        print(f"detsample audit: error: cannot write the report: {exc}", file=sys.stderr)
        return 2
    failures = check_gates(report, args.max_abs_diff, args.min_exact_match)
    for f in failures:
        print(f"detsample audit: GATE FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0
