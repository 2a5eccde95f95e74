"""``detsample audit-log``: the audit metrics of a training run over steps, with gates on
the latest step.

Exit codes: 0 ok, 1 a gate failed on the latest step (step and metric named), 2 bad
input or usage.
"""

from __future__ import annotations

import argparse
import json
import sys

from detsample.cli._argtypes import fraction, max_excluded, nonneg_float
from detsample.cli._outputs import output_problems, report_clash, report_failure, write_output
from detsample.errors import DetsampleError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "audit-log",
        help="plot per-step audit metrics of a training run (AuditLog) and gate",
        description="Read the JSON-lines log that detsample.audit.AuditLog writes (one row "
        "per training step), print the first and latest step, draw mean |d|, "
        "max |d|, k3 KL, mismatch fraction and importance-ratio quantiles over "
        "steps, and gate on the latest step (docs/audit.md).",
    )
    p.add_argument("log", metavar="PATH", help="the audit log (JSON lines; '-' = stdin)")
    p.add_argument("--report", metavar="DIR", help="write index.html and the PNG plot here")
    p.add_argument("--json", metavar="PATH", help="write the rows as a JSON list ('-' = stdout)")
    p.add_argument(
        "--max-abs-diff", type=nonneg_float, metavar="T", help="gate: exit 1 when the latest step's max |d| > T"
    )
    p.add_argument(
        "--min-exact-match",
        type=fraction,
        metavar="F",
        help="gate: exit 1 when the latest step's exact-match fraction < F",
    )
    p.add_argument(
        "--max-k3", type=nonneg_float, metavar="K", help="gate: exit 1 when the latest step's mean k3 KL > K"
    )
    p.add_argument(
        "--max-mismatch",
        type=fraction,
        metavar="F",
        help="gate: exit 1 when the latest step's fraction of tokens with d != 0 > F",
    )
    p.add_argument(
        "--max-excluded",
        type=max_excluded,
        metavar="N|FRACTION",
        help="under a gate, allow at most N excluded sequences in the latest step "
        "(an integer) or this fraction of them (default 0)",
    )
    p.add_argument("--quiet", action="store_true", help="no summary table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from detsample.audit.reports.log import (
        LOG_REPORT_FILES,
        check_log_gates,
        format_log_summary,
        read_log,
        write_log_report,
    )

    problems = output_problems((args.json, "--json", "file"), (args.report, "--report", "dir"))
    problems += [clash for clash in [report_clash(args, [(args.log, "PATH")], LOG_REPORT_FILES)] if clash]
    if problems:
        print(f"detsample audit-log: error: {problems[0]}", file=sys.stderr)
        return 2
    try:
        rows = read_log(args.log)
    except DetsampleError as exc:
        print(f"detsample audit-log: error: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print(f"detsample audit-log: error: {args.log}: no steps logged", file=sys.stderr)
        return 2
    if not args.quiet:
        sys.stdout.write(format_log_summary(rows))  # stderr under --json -
    text = json.dumps(rows, indent=2) + "\n"
    failed = write_output(args.json, text, "--json") if args.json else None
    if not failed and args.report:
        try:
            print(f"report: {write_log_report(rows, args.report)}", file=sys.stderr)
        except OSError as exc:
            failed = report_failure(exc, args.report)
    if failed:
        print(f"detsample audit-log: error: {failed}", file=sys.stderr)
        return 2
    failures = check_log_gates(
        rows, args.max_abs_diff, args.min_exact_match, args.max_k3, args.max_mismatch, args.max_excluded
    )
    for f in failures:
        print(f"detsample audit-log: GATE FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0
