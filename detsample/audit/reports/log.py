"""The audit across a training run: one row of metrics per step, plotted over steps.

``AuditLog(path)`` appends one JSON line per training step (from a report of
:func:`detsample.audit.from_tensors` or :func:`detsample.audit.audit`);
``detsample audit-log PATH --report DIR`` (:func:`write_log_report`) draws the metrics
over steps and gates on the latest step: the question RL teams ask is "does the mismatch
between engine and trainer grow over training?".

A row (docs/audit.md, "Over a training run")::

    {"step": 12, "sequences": 256, "excluded_sequences": 0, "tokens": 501234,
     "exact_match_fraction": 0.71, "mismatch_fraction": 0.29, "mean_abs_diff": 0.011,
     "max_abs_diff": 0.9, "k3_kl_mean": 6e-5, "abs_diff_p99": 0.08,
     "ratio": {"mean": 1.0, "min": 0.4, "max": 2.4, "p0.1": ..., "p50": 1.0, ...}}

Only one process of a run should write the log (rank 0); rows are appended and flushed
one line at a time, so a crash loses at most the step being written.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import BinaryIO

from detsample.audit.analysis.metrics import RATIO_QUANTILE_KEYS
from detsample.audit.inputs.values import count_of, number_of
from detsample.audit.issues import AuditInputError
from detsample.audit.reports.report import figure, fmt_value, save_figure
from detsample.audit.running.gates import ExclusionLimit, exclusion_failure, no_tokens_failure
from detsample.inputs import LOG_LINE_BYTES, file_problem, loads, read_line
from detsample.outputs import append_file, write_file

#: per-step scalars of a row, in the order the summary prints them
LOG_METRICS = (
    "tokens",
    "exact_match_fraction",
    "mismatch_fraction",
    "mean_abs_diff",
    "max_abs_diff",
    "k3_kl_mean",
    "abs_diff_p99",
)
LOG_PLOT = "metrics_over_steps.png"
#: the files ``write_log_report`` writes into its folder
LOG_REPORT_FILES = (LOG_PLOT, "index.html")


def _finite(v: object) -> object:
    """JSON-safe: non-finite floats as the strings "inf" / "-inf" / "nan"."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _number(v: object) -> float | None:
    if v is None:
        return None
    if isinstance(v, str):
        return float(v)  # "inf", "-inf", "nan"
    return float(v)  # type: ignore[arg-type]


def log_row(report: dict, step: int) -> dict:
    """The row :class:`AuditLog` writes for ``report`` at ``step``."""
    ir = report["importance_ratio"]
    ratio = {k: _finite(ir[k]) for k in ("mean", "min", "max")}
    ratio.update({k: _finite(v) for k, v in (ir.get("quantiles") or {}).items()})
    return {
        "step": step,
        "sequences": report["sequences"],
        "excluded_sequences": report["excluded_sequences"],
        "tokens": report["tokens"],
        "exact_match_fraction": report["exact_match_fraction"],
        "mismatch_fraction": report["mismatch_fraction"]["0"],
        "mean_abs_diff": _finite(report["mean_abs_diff"]),
        "max_abs_diff": _finite(report["max_abs_diff"]),
        "k3_kl_mean": _finite(report["k3_kl_mean"]),
        "abs_diff_p99": _finite(report["abs_diff_quantiles"]["p99"]),
        "ratio": ratio,
    }


class AuditLog:
    """Append-only log of per-step audit metrics (JSON lines at ``path``).

    ``log.append(report, step=None)`` writes one row; ``step`` defaults to one more than
    the last step in the file (0 for a new file). ``log.audit_tensors(response_ids,
    engine_logprobs, trainer_logprobs, mask, step=None, **kwargs)`` audits a padded batch
    with :func:`detsample.audit.from_tensors` and logs it; it returns the report.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        rows = read_log(self.path) if os.path.exists(self.path) else []
        self._next = rows[-1]["step"] + 1 if rows else 0

    def append(self, report: dict, step: int | None = None) -> dict:
        """Write the row of ``report`` (flushed at once); returns it."""
        if step is None:
            step = self._next
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"step must be an int, got {step!r}")
        row = log_row(report, step)
        line = json.dumps(row, allow_nan=False)
        append_file(self.path, line + "\n", "the audit log")  # whole rows only
        self._next = step + 1
        return row

    def audit_tensors(
        self,
        response_ids: object,
        engine_logprobs: object,
        trainer_logprobs: object,
        mask: object = None,
        *,
        step: int | None = None,
        **kwargs: object,
    ) -> dict:
        """Audit one padded batch (:func:`detsample.audit.from_tensors`) and log it."""
        from detsample.audit.running.tensors import from_tensors

        report = from_tensors(response_ids, engine_logprobs, trainer_logprobs, mask, **kwargs)
        self.append(report, step)
        return report


#: how each field of a row is read (the value rules of :mod:`detsample.audit.inputs.values`):
#: counts, fractions in [0, 1], non-negative metrics (null: no token audited)
_COUNTS = ("step", "sequences", "excluded_sequences", "tokens")
_RANGES = {
    "exact_match_fraction": 1.0,
    "mismatch_fraction": 1.0,
    "mean_abs_diff": math.inf,
    "max_abs_diff": math.inf,
    "k3_kl_mean": math.inf,
    "abs_diff_p99": math.inf,
}


def row_problem(row: object) -> str | None:
    """Why ``row`` is not an audit-log row, naming the field and the value, or None: every
    field of :data:`LOG_METRICS` and ``ratio`` present, counts non-negative integers,
    fractions in [0, 1], |d|, KL and ratios non-negative numbers (or null)."""
    if not isinstance(row, dict) or "step" not in row:
        return "not an audit-log row (no integer step)"
    missing = [m for m in LOG_METRICS if m not in row]
    if missing or not isinstance(row.get("ratio"), dict):
        return f"missing {', '.join(missing or ['ratio'])}"
    for key in _COUNTS:
        if key in row:
            _, _, problem = count_of(row[key])
            if problem:
                return f"{key} {problem}"
    fields = [(k, row[k], hi) for k, hi in _RANGES.items()]
    fields += [(f"ratio.{k}", v, math.inf) for k, v in row["ratio"].items()]
    for key, v, hi in fields:
        if v is not None:
            _, _, problem = number_of(v, 0.0, hi)
            if problem:
                return f"{key} {problem}"
    return None


#: slack of a sum of two fractions of one count (each rounded once to a float)
_FRACTION_SLACK = 1e-9


def row_contradiction(row: dict) -> str | None:
    """Why the fields of a valid row (:func:`row_problem`) contradict each other, or None: a
    gate must never pass on numbers that cannot all be true. Tokens need sequences; no
    token means no metric; a bitwise-equal token has d == 0, so exact matches and tokens
    with d != 0 are disjoint (their fractions sum to at most 1); |d| > 0 somewhere means a
    mismatching token; the max |d| bounds its mean and its p99."""
    exact, mism, top = (_value(row, k) for k in ("exact_match_fraction", "mismatch_fraction", "max_abs_diff"))
    if row["sequences"] == 0 and row["tokens"] > 0:
        return f"sequences 0 but tokens {row['tokens']}: tokens are audited in sequences"
    if row["tokens"] == 0:
        given = [k for k in _RANGES if row[k] is not None]
        return f"tokens 0 but {given[0]} {row[given[0]]!r} (no token audited: null)" if given else None
    if exact is not None and mism is not None and exact + mism > 1 + _FRACTION_SLACK:
        return (
            f"exact_match_fraction {exact!r} and mismatch_fraction {mism!r} sum past 1 "
            f"(a bitwise-equal token has d == 0)"
        )
    if top is not None and mism is not None and (top > 0) != (mism > 0):
        return f"max_abs_diff {row['max_abs_diff']!r} but mismatch_fraction {mism!r} (d != 0 iff |d| > 0)"
    for key in ("mean_abs_diff", "abs_diff_p99"):
        below = _value(row, key)
        if top is not None and below is not None and below > top:
            return f"{key} {row[key]!r} above max_abs_diff {row['max_abs_diff']!r}"
    return None


def _value(row: dict, key: str) -> float | None:
    """A valid row's metric as a float ("inf" read as infinity), or None when null."""
    return None if row[key] is None else number_of(row[key], 0.0, math.inf)[0]


def read_log(path: str) -> list[dict]:
    """The rows of an audit log, in file order. The file must be a regular file
    (:func:`detsample.inputs.input_file`), a line at most ``LOG_LINE_BYTES``; a bad line
    (invalid JSON, a missing field, a value out of its range: :func:`row_problem`; fields
    that contradict each other: :func:`row_contradiction`) is an AuditInputError naming the
    line, the fields and the values. Blank lines are skipped.
    ``path`` "-" reads stdin (named ``<stdin>``)."""
    if path == "-":  # stdin: a pipe is read as it comes, line by line, each line bounded
        return _read_rows(sys.stdin.buffer, "<stdin>")
    problem = file_problem(path)  # a FIFO would block, a device never end
    if problem:
        raise AuditInputError(
            f"{path}: cannot read the audit log: it {problem}"
            if problem.startswith("is ")
            else f"{path}: cannot read the audit log: {problem}"
        )
    try:
        f = open(path, "rb")  # noqa: SIM115 - its OSError named apart; closed by the with below
    except OSError as exc:
        raise AuditInputError(f"{path}: cannot read the audit log ({exc.strerror})") from exc
    with f:
        return _read_rows(f, path)


def _read_rows(f: BinaryIO, path: str) -> list[dict]:
    """The rows of the open log ``f`` (named ``path`` in messages); see :func:`read_log`."""
    rows = []
    for k in itertools.count(1):
        raw = read_line(f, LOG_LINE_BYTES, f"{path}:line {k}")
        if not raw:
            break
        if not raw.strip():
            continue
        try:
            row = loads(raw)
        except UnicodeDecodeError as exc:
            raise AuditInputError(f"{path}:line {k}: not UTF-8 ({exc.reason})") from None
        except ValueError as exc:
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise AuditInputError(f"{path}:line {k}: invalid JSON: {why}") from None
        problem = row_problem(row) or row_contradiction(row)
        if problem:
            raise AuditInputError(f"{path}:line {k}: {problem}")
        rows.append(row)
    return rows


def check_log_gates(
    rows: Sequence[dict],
    max_abs_diff: float | None = None,
    min_exact_match: float | None = None,
    max_k3: float | None = None,
    max_mismatch: float | None = None,
    max_excluded: ExclusionLimit | int | float | str | None = None,
) -> list[str]:
    """Failed gates on the latest row (the last one written), each naming the step and
    the metric; empty when every gate passes. The rules of
    :func:`detsample.audit.running.gates.check_gates` apply: a step that audited no token fails,
    and under any gate more excluded sequences than ``max_excluded`` (default 0) fail."""
    if not rows:
        return ["no steps logged"]
    last = rows[-1]
    step = last["step"]
    failures = []
    excluded = int(last.get("excluded_sequences") or 0)
    seen = int(last.get("sequences") or 0) + excluded
    empty = no_tokens_failure({"tokens": last["tokens"], "sequences_seen": seen, "excluded_sequences": excluded})
    if empty:
        failures.append(f"step {step}: {empty}")
    limits = (max_abs_diff, min_exact_match, max_k3, max_mismatch, max_excluded)
    if any(v is not None for v in limits):
        bad = exclusion_failure(excluded, seen, ExclusionLimit.of(max_excluded))
        if bad:
            failures.append(f"step {step}: {bad}")
    for key, limit, above in (
        ("max_abs_diff", max_abs_diff, True),
        ("k3_kl_mean", max_k3, True),
        ("mismatch_fraction", max_mismatch, True),
        ("exact_match_fraction", min_exact_match, False),
    ):
        if limit is None:
            continue
        v = _number(last[key])
        if v is None:
            failures.append(f"step {step}: {key}: no tokens audited")
        elif (not v <= limit) if above else (not v >= limit):
            failures.append(f"step {step}: {key} = {v!r} {'>' if above else '<'} {limit!r}")
    return failures


def format_log_summary(rows: Sequence[dict]) -> str:
    """First and latest step side by side, per metric."""
    if not rows:
        return "detsample audit-log: no steps logged\n"
    first, last = rows[0], rows[-1]
    lines = [
        f"detsample audit-log: {len(rows)} steps ({first['step']} .. {last['step']})",
        f"  {'metric':<22}{'step ' + str(first['step']):>16}{'step ' + str(last['step']):>16}",
    ]
    for m in LOG_METRICS:
        lines.append(f"  {m:<22}{fmt_value(first[m]):>16}{fmt_value(last[m]):>16}")
    for q in ("p1", "p50", "p99"):
        lines.append(f"  {'ratio ' + q:<22}{fmt_value(first['ratio'].get(q)):>16}{fmt_value(last['ratio'].get(q)):>16}")
    return "\n".join(lines) + "\n"


def _series(rows: Sequence[dict], key: str, sub: str | None = None) -> list[float]:
    out = []
    for r in rows:
        v = r[key] if sub is None else r[key].get(sub)
        x = _number(v)
        out.append(math.nan if x is None else x)
    return out


def write_log_plot(rows: Sequence[dict], path: str) -> str:
    """One PNG, four panels over steps: |d| (mean, p99, max), k3 KL, mismatch fraction,
    importance-ratio quantiles."""
    rows = sorted(rows, key=lambda r: r["step"])  # stable: re-logged steps keep file order
    steps = [r["step"] for r in rows]
    fig = figure(9, 8)
    ax = fig.subplots(2, 2)
    for key, style in (("mean_abs_diff", "o-"), ("abs_diff_p99", "^:"), ("max_abs_diff", "s--")):
        ax[0, 0].plot(steps, _series(rows, key), style, markersize=3, label=key)
    ax[0, 0].set_yscale("symlog", linthresh=1e-9)
    ax[0, 0].set_title("|d| = |trainer - engine| (nats)")
    ax[0, 0].legend(fontsize=7)
    ax[0, 1].plot(steps, _series(rows, "k3_kl_mean"), "o-", markersize=3)
    ax[0, 1].set_yscale("symlog", linthresh=1e-12)
    ax[0, 1].set_title("k3 KL(engine || trainer), mean per token")
    ax[1, 0].plot(steps, _series(rows, "mismatch_fraction"), "o-", markersize=3, label="d != 0")
    ax[1, 0].plot(
        steps, [1 - x for x in _series(rows, "exact_match_fraction")], "x:", markersize=3, label="not bitwise equal"
    )
    ax[1, 0].set_ylim(-0.02, 1.02)
    ax[1, 0].set_title("mismatching token fraction")
    ax[1, 0].legend(fontsize=7)
    lo_hi = (("p0.1", "p99.9", 0.15), ("p1", "p99", 0.25), ("p10", "p90", 0.4))
    for lo, hi, alpha in lo_hi:
        if lo in RATIO_QUANTILE_KEYS and hi in RATIO_QUANTILE_KEYS:
            ax[1, 1].fill_between(
                steps,
                _series(rows, "ratio", lo),
                _series(rows, "ratio", hi),
                alpha=alpha,
                color="tab:blue",
                label=f"{lo}..{hi}",
            )
    ax[1, 1].plot(steps, _series(rows, "ratio", "p50"), "k-", linewidth=1, label="p50")
    ax[1, 1].axhline(1.0, color="gray", linewidth=0.5)
    ax[1, 1].set_title("importance ratio r = p_trainer / p_engine")
    ax[1, 1].legend(fontsize=7)
    for a in ax.ravel():
        a.set_xlabel("training step")
    fig.tight_layout()
    save_figure(fig, path)
    return path


def write_log_report(rows: Sequence[dict], out_dir: str) -> str:
    """``index.html`` with the plot and a table of every step; returns the page."""
    os.makedirs(out_dir, exist_ok=True)
    write_log_plot(rows, os.path.join(out_dir, LOG_PLOT))
    cols = ["step"] + list(LOG_METRICS) + [f"ratio {q}" for q in ("p1", "p50", "p99")]
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(fmt_value(v))}</td>"
            for v in [r["step"]] + [r[m] for m in LOG_METRICS] + [r["ratio"].get(q) for q in ("p1", "p50", "p99")]
        )
        + "</tr>"
        for r in rows
    )
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    page = os.path.join(out_dir, "index.html")
    write_file(
        page,
        "<!doctype html><html><head><meta charset='utf-8'><title>detsample "
        "audit-log</title><style>body{font-family:sans-serif;margin:2em}table{border-"
        "collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:"
        f"right}}</style></head><body><h1>detsample audit-log</h1><img src='{LOG_PLOT}'>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        "<p>Metric definitions: docs/audit.md.</p></body></html>\n",
        "--report",
    )
    return page
