"""``detsample probe``: where a model or its kernels break batch invariance (docs/probe.md).

``detsample probe ops`` probes single ops; ``detsample probe model MODEL`` probes a causal
LM. Exit codes: 0 every check holds, 1 a check fails, 2 usage error (unknown model, a
factory that does not import, an unavailable device, an unwritable --json).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from detsample.cli._argtypes import (
    PORTABLE_NEEDS_MODE,
    apply_threads,
    portable_without_mode,
    thread_count,
    thread_counts,
    tp_needs_portable,
    tp_sizes,
)
from detsample.cli._outputs import output_problem, write_output
from detsample.cli._progress import Progress

DTYPE_NAMES = ("float32", "bfloat16", "float16")


def _dtypes(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",")]
    bad = [n for n in names if n not in DTYPE_NAMES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"must be a comma list of {', '.join(DTYPE_NAMES)}, got {text!r}")
    return names


def _threads(text: str) -> list[int]:
    try:
        return thread_counts(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"must be a comma list of thread counts, got {text!r}: {exc}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "probe",
        help="find where a model or its kernels break batch invariance",
        description="Probe ops or a model for batch invariance, prefill/decode "
        "alignment, run-to-run and thread-count determinism "
        "(docs/probe.md). Exit 0 all hold, 1 a check fails, 2 usage.",
    )
    kinds = p.add_subparsers(dest="probe_kind", metavar="KIND")
    ops = kinds.add_parser(
        "ops",
        help="micro-probes of the ops transformers run",
        description="Per op and dtype: batch-invariant (row alone vs in a batch), run to run, 1 vs N threads.",
    )
    ops.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ops.add_argument(
        "--dtype",
        type=_dtypes,
        default=["float32"],
        metavar="LIST",
        help="comma list of float32, bfloat16, float16 (default float32)",
    )
    ops.add_argument(
        "--threads",
        type=_threads,
        default=[1, 2],
        metavar="LIST",
        help="CPU thread counts to measure at and compare (default 1,2)",
    )
    ops.add_argument(
        "--op",
        type=lambda s: [o.strip() for o in s.split(",")],
        default=None,
        metavar="LIST",
        help="only these ops (comma list; default all)",
    )
    ops.add_argument("--batch-invariant", action="store_true", help="run the probes under detsample.batch_invariant()")
    ops.add_argument("--json", metavar="PATH", help="write the JSON report here ('-' = stdout)")
    ops.set_defaults(func=run_ops)
    model = kinds.add_parser(
        "model",
        help="probe a causal LM",
        description="Checks batch_invariance, prefill_decode, "
        "chunked_prefill, run_to_run, threads, bitwise; a "
        "failed check names the first module and aten op "
        "that differ.",
    )
    model.add_argument(
        "model",
        metavar="MODEL",
        help="hf-tiny-llama, hf-tiny-qwen2, refmodel, refmodel-float or package.module:factory",
    )
    model.add_argument(
        "--batch-invariant", action="store_true", help="run the model under the batch-invariant mode (verified kernels)"
    )
    model.add_argument(
        "--portable",
        action="store_true",
        help="with --batch-invariant: the mode's portable kernels (the same "
        "bits on every CPU, docs/batch-invariant.md)",
    )
    model.add_argument(
        "--tp",
        type=tp_sizes,
        default=None,
        metavar="LIST",
        help="also run the model tensor-parallel at these sizes (comma list, "
        "e.g. 1,2,4) on a local gloo process group and add the check "
        "tensor_parallel: logits vs TP=1, bitwise (docs/tensor-parallel.md)",
    )
    model.add_argument(
        "--threads",
        type=thread_count,
        default=None,
        metavar="N",
        help="torch intra-op threads of this process for every check (default: "
        "torch's); the threads check then compares 1 and N threads (N = 1: "
        "1 and 2)",
    )
    model.add_argument("--json", metavar="PATH", help="write the JSON report here ('-' = stdout)")
    model.set_defaults(func=run_model)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _error(msg: str) -> int:
    print(f"detsample probe: error: {msg}", file=sys.stderr)
    return 2


def _emit(report: Any, path: str | None) -> int | None:
    """Print the table and write ``--json``; 2 when the JSON cannot be written."""
    from detsample.probe.report import dumps

    text = dumps(report)
    sys.stdout.write(report.table())  # stderr under --json - (detsample.outputs.streams)
    failed = write_output(path, text, "--json") if path else None
    return _error(failed) if failed else None


def run_ops(args: argparse.Namespace) -> int:
    problem = output_problem(args.json, "--json")
    if problem:  # before the probes run
        return _error(problem)
    from detsample.golden.fingerprint import platform_fingerprint
    from detsample.invariant import batch_invariant
    from detsample.probe.ops import probe_ops
    from detsample.probe.report import OpsReport

    mode = batch_invariant if args.batch_invariant else None
    try:
        platform = platform_fingerprint(args.device)
        results = probe_ops(args.device, args.dtype, args.threads, ops=args.op, mode=mode)
    except ValueError as e:
        return _error(str(e))
    report = OpsReport(platform, tuple(results))
    failed = _emit(report, args.json)
    return failed if failed is not None else (0 if report.ok else 1)


def run_model(args: argparse.Namespace) -> int:
    problem = output_problem(args.json, "--json")
    if problem:  # before the model is built and probed
        return _error(problem)
    from detsample.golden.fingerprint import platform_fingerprint
    from detsample.models import ModelError, load_model
    from detsample.probe.model import ProbeConfig, probe_model

    if portable_without_mode(args):
        return _error(PORTABLE_NEEDS_MODE)
    refused = tp_needs_portable(args, args.tp or [])
    if refused:
        return _error(refused)
    try:
        model = load_model(args.model, batch_invariant=args.batch_invariant, portable=args.portable)
        device = getattr(model, "device", "cpu")
        if args.tp:
            from detsample.parallel import TPModelSpec, check_spec

            for tp in args.tp:  # a refused size is a usage error, before any probe runs
                check_spec(TPModelSpec(args.model, tp, args.batch_invariant, args.portable), model)
        apply_threads(args)
        config = ProbeConfig(threads=(1, max(args.threads or 2, 2)))
        with Progress(f"probe model {args.model}") as progress:
            progress(0, None)
            report = probe_model(model, config, platform=platform_fingerprint(device), target=args.model)
            if args.tp:
                report = _with_tp(report, model, args)
    except ModelError as e:
        return _error(str(e))
    failed = _emit(report, args.json)
    return failed if failed is not None else (0 if report.ok else 1)


def _with_tp(report: Any, model: Any, args: argparse.Namespace) -> Any:
    """``report`` with the ``tensor_parallel`` check appended (docs/tensor-parallel.md)."""
    from dataclasses import replace

    from detsample.parallel import RankError
    from detsample.probe.parallel import CHECK_NAME, check_tensor_parallel
    from detsample.probe.report import ProbeCheck

    try:
        check = check_tensor_parallel(
            model, args.model, args.tp, batch_invariant=args.batch_invariant, portable=args.portable
        )
    except RankError as e:  # a rank failed: the check fails, saying how
        check = ProbeCheck(CHECK_NAME, False, str(e))
    return replace(report, checks=report.checks + (check,))
