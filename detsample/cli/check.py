"""``detsample check``: the CI gate (goldens, invariances, alignment, external checks).

Prints a progress bar on stderr when stderr is a terminal (``rich``,
:mod:`detsample.cli._progress`; nothing when it is a file, a pipe or CI, so CI logs stay
clean) and a summary table on stdout, headed
by the golden folder it compared against and how this run dispatches (the CPU ISA,
native or emulated through ``ATEN_CPU_CAPABILITY``); ``--json PATH`` writes ``{"ok": bool,
"platform": str, "golden_dir": str, "checks": [{"name", "ok", "detail"}]}``. Exit status 0
only when every check holds, 1 otherwise (a platform without goldens is a failure unless
``--allow-missing-goldens``).

On any CPU the goldens compared against are the one ``golden/cpu`` folder: the sampler's
bits are defined by detsample's own arithmetic, so no instruction set, MKL code path,
CPU vendor or architecture, thread count or torch build (``+cpu``, ``+cu130``) changes
them, and nothing is re-run under another setting (docs/golden.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from detsample.checks.result import CheckResult
from detsample.cli._progress import Progress


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "check",
        help="run the reproducibility battery (CI gate)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="smoke run: the quick scenario subset")
    p.add_argument("--json", metavar="PATH", default=None, help="write a JSON report to PATH")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--golden-dir", default=None, metavar="PATH", help="golden root (default: golden/)")
    p.add_argument(
        "--allow-missing-goldens",
        action="store_true",
        help="report a platform without goldens as skipped instead of failing",
    )
    p.add_argument(
        "-k", "--scenario", action="append", default=None, metavar="NAME", help="only these scenarios (repeatable)"
    )
    # accepted for old scripts: there is no re-run under another ISA or MKL level any more
    p.add_argument("--no-isa-fallback", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def table(results: list[CheckResult]) -> str:
    """The summary table: one line per check, then the full detail of failures."""
    w = max([len(r.name) for r in results] + [5])
    lines = [f"{'CHECK':<{w}}  RESULT  DETAIL", f"{'-' * w}  ------  {'-' * 40}"]
    for r in results:
        status = "SKIP" if r.skipped else ("PASS" if r.ok else "FAIL")
        lines.append(f"{r.name:<{w}}  {status:<6}  {r.detail.splitlines()[0] if r.detail else ''}")
    for r in results:
        if not r.ok and "\n" in r.detail:
            lines += ["", f"== {r.name}: FAIL ==", r.detail]
    return "\n".join(lines)


def golden_source(store: Any) -> str:
    """How this process dispatches (the ISA, native or emulated) and, when the folder's
    manifests say it, how its goldens were produced."""
    from detsample.golden import isa

    here = isa.describe() if store.device.type == "cpu" else f"{store.device.type} {store.fingerprint}"
    made = sorted(
        {f"{d.get('machine_isa')} {d.get('mode')}" for d in isa.recorded_dispatch(store.platform_dir)}
    )  # validated
    return f"this run: {here}; goldens produced on: {', '.join(made) or 'not recorded'}"


def run(args: argparse.Namespace) -> int:
    from detsample.checks.battery import run_battery
    from detsample.cli._outputs import output_problem, write_output
    from detsample.golden import registry
    from detsample.golden.store import GoldenStore
    from detsample.outputs import output_inside_problem

    problem = output_problem(args.json, "--json")
    if problem:  # before the battery runs, not after it
        print(f"detsample check: error: {problem}", file=sys.stderr)
        return 2
    try:
        store = GoldenStore(args.golden_dir, device=args.device)
        for name in args.scenario or ():
            registry.get(name)
        inside = output_inside_problem(args.json, "--json", store.platform_dir, "--golden-dir")
        if inside:
            raise ValueError(inside)
    except (ValueError, RuntimeError) as e:
        print(f"detsample check: error: {e}", file=sys.stderr)
        return 2
    except KeyError as e:
        print(f"detsample check: error: {e.args[0]}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    results = run_battery(
        quick=args.quick,
        device=args.device,
        store=store,
        progress=Progress("check"),
        names=args.scenario,
        allow_missing_goldens=args.allow_missing_goldens,
    )
    ok = all(r.ok for r in results)
    print(
        f"detsample check  platform {store.fingerprint}  device {args.device}"
        f"{'  (quick)' if args.quick else ''}  {time.perf_counter() - t0:.1f} s"
    )
    print(f"goldens compared against {store.platform_dir}  ({golden_source(store)})")
    print(table(results))
    n_bad = sum(not r.ok for r in results)
    n_skip = sum(r.skipped for r in results)
    note = f" ({n_skip} SKIPPED, see above)" if n_skip else ""
    if args.json:  # before the verdict: never ALL CHECKS PASSED, then a failed write
        doc = {
            "ok": ok,
            "platform": store.fingerprint,
            "golden_dir": str(store.platform_dir),
            "checks": [r.to_json() for r in results],
        }
        failed = write_output(args.json, json.dumps(doc, indent=2) + "\n", "--json")
        if failed:
            print(f"detsample check: error: {failed} (no verdict: the checks ran, the report is lost)", file=sys.stderr)
            return 2
    print(("ALL CHECKS PASSED" if ok else f"{n_bad} CHECK(S) FAILED") + note)
    return 0 if ok else 1
