"""``detsample audit``: engine vs trainer logprob audit of RL rollouts, with gates.

Exit codes: 0 ok, 1 a gate failed (the metric is named), 2 bad input or usage.
"""

from __future__ import annotations

import argparse
import sys

from detsample.audit.inputs.layout import PRESET_NAMES
from detsample.audit.reports.report import REPORT_FILES
from detsample.cli._argtypes import (
    PORTABLE_NEEDS_MODE,
    add_semantics_options,
    add_threads_option,
    apply_threads,
    fraction,
    max_excluded,
    model_dtype,
    model_spec,
    nonneg_float,
    portable_without_mode,
    positive_finite,
    positive_int,
    rollout_rs,
    semantics_of,
    tp_needs_portable,
)
from detsample.cli._outputs import output_problems, report_clash, report_failure, write_output
from detsample.cli._progress import Progress
from detsample.errors import DetsampleError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "audit",
        help="audit engine vs trainer logprobs of RL rollouts (JSONL/NPZ/Parquet)",
        description="Compare the logprobs an inference engine reported at sampling time with "
        "the logprobs a trainer recomputes (d = trainer - engine, over the mask). "
        "Metrics are defined in docs/audit.md.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help=".jsonl, .npz, .parquet or .pt rollouts (ragged or padded)")
    p.add_argument("--json", metavar="PATH", help="write the JSON report here ('-' = stdout)")
    p.add_argument("--report", metavar="DIR", help="write index.html, PNG plots and report.json")
    p.add_argument(
        "--strict", action="store_true", help="fail (exit 2) at the first bad sequence instead of excluding it"
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="processes to shard the files over (same report for every N)",
    )
    add_threads_option(p)
    p.add_argument("--max-abs-diff", type=nonneg_float, metavar="T", help="gate: exit 1 when max |d| > T")
    p.add_argument(
        "--min-exact-match", type=fraction, metavar="F", help="gate: exit 1 when the bitwise exact-match fraction < F"
    )
    p.add_argument(
        "--max-excluded",
        type=max_excluded,
        metavar="N|FRACTION",
        help="under a gate, allow at most N excluded sequences (an integer) or "
        "this fraction of those read (0.05); default 0: a gate never passes "
        "on rows it did not audit",
    )
    _add_rescore_options(p)
    _add_layout_options(p)
    _add_framework_options(p)
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run the shards as Ray tasks: a local Ray, or the cluster at ADDRESS "
        "(same report; needs pip install 'detsample[ray]')",
    )
    p.add_argument("--quiet", action="store_true", help="no summary table")
    p.set_defaults(func=run)


def _add_rescore_options(p: argparse.ArgumentParser) -> None:
    """--rescore MODEL and how it runs (mode, TP, the engine's logprob semantics)."""
    p.add_argument(
        "--rescore",
        metavar="MODEL",
        type=model_spec,
        help="recompute missing trainer_logprobs by one prefill with this model: "
        "refmodel, refmodel-float, hf-tiny-llama, hf-tiny-qwen2, a local "
        "Hugging Face model directory or package.module:factory",
    )
    p.add_argument(
        "--tokenizer",
        metavar="TOKENIZER",
        help="a local Hugging Face tokenizer.json (or a model directory) whose text of "
        "each token the report shows beside its id; default: --rescore's "
        "directory, when it holds one",
    )
    p.add_argument(
        "--rescore-dtype",
        type=model_dtype,
        default="float32",
        help="a --rescore model directory's parameter dtype (float32, bfloat16, float16; --dtype is the compare dtype)",
    )
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="run the --rescore model under the batch-invariant mode (docs/batch-invariant.md)",
    )
    p.add_argument(
        "--portable",
        action="store_true",
        help="with --batch-invariant: the mode's portable kernels (the same bits "
        "on every CPU; use it on both sides of a rollout -> audit loop)",
    )
    p.add_argument(
        "--tp",
        type=positive_int,
        default=1,
        metavar="M",
        help="run the --rescore model tensor-parallel over M local ranks (gloo; "
        "docs/tensor-parallel.md); M > 1 under --batch-invariant needs --portable",
    )
    add_semantics_options(p, "rescore (the engine's logprob semantics; docs/audit.md, 'Logprob semantics')")


def _add_layout_options(p: argparse.ArgumentParser) -> None:
    """How the files are read: compare dtype, preset, column mapping, padding side."""
    p.add_argument(
        "--dtype",
        choices=["promoted", "float16", "float32", "float64"],
        default="promoted",
        help="round both logprob columns to this dtype before comparing "
        "(default: the promoted dtype of the two columns)",
    )
    p.add_argument(
        "--preset",
        choices=list(PRESET_NAMES),
        help="read a framework's own column names, padding and prompt boundary (docs/audit.md, Presets)",
    )
    p.add_argument(
        "--columns",
        metavar="DST=SRC,...",
        help="map the audit's columns to the file's, e.g. "
        "engine_logprobs=rollout_log_probs,trainer_logprobs=old_log_probs "
        "(on top of --preset)",
    )
    p.add_argument(
        "--padding",
        choices=["auto", "left", "right"],
        help="side the padded responses are padded on (default: the preset's, else found from the attention mask)",
    )


def _add_framework_options(p: argparse.ArgumentParser) -> None:
    """verl's knobs of the RL frameworks' metrics."""
    p.add_argument(
        "--rollout-is-threshold",
        type=positive_finite,
        default=2.0,
        metavar="T",
        help="verl's truncated-IS threshold for the rollout-correction metrics (default 2.0, verl's)",
    )
    p.add_argument(
        "--rollout-rs",
        type=rollout_rs,
        default="token_k1",
        metavar="OPTS",
        help="verl's rejection options for the rejection metrics, comma-separated "
        "(token_k1..3, seq_sum_k1..3, seq_mean_k1..3, seq_max_k2/3; 'none': no "
        "rejection metrics; default token_k1)",
    )
    p.add_argument(
        "--rollout-rs-threshold",
        default="2.0",
        metavar="SPEC",
        help="verl's rollout_rs_threshold: one for every option or one per option, "
        "comma-separated; lower_upper ratio bounds for k1 options (default 2.0)",
    )


def run(args: argparse.Namespace) -> int:
    from detsample.audit import audit, to_json
    from detsample.audit.reports.provenance import provenance, with_verdict
    from detsample.audit.reports.report import format_summary, with_token_text
    from detsample.audit.running.rescore import ModelRescorer, TPRescorer

    problems = output_problems((args.json, "--json", "file"), (args.report, "--report", "dir"))
    problems += [clash for clash in [report_clash(args, [(f, "FILE") for f in args.files], REPORT_FILES)] if clash]
    if problems:  # before any file is read: a long audit never ends in an unwritable path
        print(f"detsample audit: error: {problems[0]}", file=sys.stderr)
        return 2
    rescore = None
    apply_threads(args)
    try:
        tokenizer = _report_tokenizer(args)  # before any file is read
        rescore = _rescorer(args)
        opts = _options(args, rescore)
        with Progress("audit --rescore") as progress:
            if isinstance(rescore, ModelRescorer) and args.workers == 1 and args.ray is None:
                rescore.progress = progress
            report = audit(args.files, opts)
    except (DetsampleError, OSError, ValueError) as exc:
        why = "; ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
        print(f"detsample audit: error: {why}", file=sys.stderr)  # one line
        return 2
    finally:
        if isinstance(rescore, TPRescorer):
            rescore.close()
    failures = with_verdict(report, args.max_abs_diff, args.min_exact_match, args.max_excluded)
    report["provenance"] = provenance(opts, command=getattr(args, "command_line", None))
    with_token_text(report, tokenizer)
    text = to_json(report)
    if not args.quiet:  # on stderr under --json - (detsample.outputs.streams)
        sys.stdout.write(format_summary(report))
    failed = _write_outputs(args, report, text)
    if failed:
        print(f"detsample audit: error: {failed}", file=sys.stderr)
        return 2
    for f in failures:
        print(f"detsample audit: GATE FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


def _report_tokenizer(args: argparse.Namespace):
    """The tokenizer the report decodes tokens with: --tokenizer, else --rescore's model
    directory when it holds a tokenizer.json; None without one."""
    from pathlib import Path

    from detsample.audit.running.text import load_text_tokenizer
    from detsample.models import is_model_dir_spec

    if args.tokenizer:
        return load_text_tokenizer(args.tokenizer)
    if args.rescore and is_model_dir_spec(args.rescore) and (Path(args.rescore) / "tokenizer.json").is_file():
        return load_text_tokenizer(args.rescore)
    return None


def _rescorer(args: argparse.Namespace):
    """The --rescore model as a rescorer in the given semantics (ModelRescorer, TPRescorer
    with --tp), or None; ValueError naming a combination of options that cannot run."""
    from detsample.audit.running.rescore import ModelRescorer, TPRescorer
    from detsample.audit.semantics import RAW

    rescore = args.rescore
    if portable_without_mode(args):
        raise ValueError(PORTABLE_NEEDS_MODE)
    refused = tp_needs_portable(args, [args.tp])
    if refused:
        raise ValueError(refused)
    if args.batch_invariant and rescore is None:
        raise ValueError("--batch-invariant applies to the --rescore model; give --rescore MODEL")
    semantics = semantics_of(args)
    if semantics is not None and rescore is None:
        raise ValueError(
            "--logprobs-mode and the filters describe the --rescore model's logprobs; give --rescore MODEL"
        )
    semantics = semantics or RAW
    if args.rescore_dtype != "float32" and (rescore is None or args.tp > 1):
        raise ValueError("--rescore-dtype applies to a --rescore model directory at --tp 1")
    if args.tp > 1:
        if rescore is None:
            raise ValueError(f"--tp {args.tp} applies to the --rescore model; give --rescore MODEL")
        return TPRescorer(
            rescore, args.tp, batch_invariant=args.batch_invariant, portable=args.portable, semantics=semantics
        )
    if rescore is not None:
        return ModelRescorer(
            rescore,
            batch_invariant=args.batch_invariant,
            portable=args.portable,
            semantics=semantics,
            dtype=args.rescore_dtype,
        )
    return None


def _options(args: argparse.Namespace, rescore):
    from detsample.audit import AuditOptions
    from detsample.audit.analysis.frameworks import FrameworkOptions

    frameworks = FrameworkOptions(args.rollout_is_threshold, args.rollout_rs, args.rollout_rs_threshold)
    return AuditOptions.make(
        rescore=rescore,
        strict=args.strict,
        workers=args.workers,
        frameworks=frameworks,
        compare_dtype=None if args.dtype == "promoted" else args.dtype,
        preset=args.preset,
        columns=args.columns,
        padding=args.padding,
        ray=args.ray,
    )


def _write_outputs(args: argparse.Namespace, report: dict, text: str) -> str | None:
    """Write --json (a file) and --report; the first failure's message, or None (an
    unwritable output is exit 2 naming the path, never a failed gate's exit 1)."""
    from detsample.audit.reports.report import write_report

    failed = write_output(args.json, text, "--json") if args.json else None
    if not failed and args.report:
        try:
            print(f"report: {write_report(report, args.report)}", file=sys.stderr)
        except OSError as exc:
            failed = report_failure(exc, args.report)
    return failed
