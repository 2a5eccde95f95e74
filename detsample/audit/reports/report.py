"""Human-facing audit output: the terminal summary table, an HTML page and PNG plots.

Everything here reads the report dict of :func:`detsample.audit.audit` only. Plots use
matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so
importing or calling this module never changes the process's matplotlib state.
"""

from __future__ import annotations

import html
import os

from detsample.audit.analysis.metrics import QUANTILE_KEYS
from detsample.outputs import write_file

PLOTS = ("abs_diff_histogram.png", "diff_by_position.png", "diff_by_probability.png")
#: the files ``write_report`` writes into its folder
REPORT_FILES = PLOTS + ("report.json", "index.html")


def fmt_value(v: object) -> str:
    """A report value for a table cell: "-" for None, 6 significant digits for floats."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.4f} %"


def summary_rows(report: dict) -> list[tuple[str, str]]:
    """(label, value) rows of the summary table."""
    r = report
    ir = r["importance_ratio"]
    sq = r["sequence"]
    fd = sq["first_divergence"]
    rows = [
        ("sequences", f"{r['sequences']} audited, {r['excluded_sequences']} excluded (of {r['sequences_seen']})"),
        ("tokens", f"{r['tokens']} audited, {r['unmasked_tokens']} masked out"),
        ("exact_match_fraction", f"{_pct(r['exact_match_fraction'])} ({r['exact_matches']} / {r['tokens']})"),
    ]
    rows += [
        (f"mismatch |d| > {k}", f"{_pct(v)} ({r['mismatch_count'][k]})") for k, v in r["mismatch_fraction"].items()
    ]
    rows += [
        (
            "|d| mean / std / max",
            " / ".join(fmt_value(r[k]) for k in ("mean_abs_diff", "std_abs_diff", "max_abs_diff")),
        ),
        ("|d| " + " / ".join(QUANTILE_KEYS), " / ".join(fmt_value(r["abs_diff_quantiles"][k]) for k in QUANTILE_KEYS)),
        ("d mean / min / max", " / ".join(fmt_value(r[k]) for k in ("mean_diff", "min_diff", "max_diff"))),
        ("KL k1 / k2 / k3 (mean)", " / ".join(fmt_value(r[k]) for k in ("k1_kl_mean", "k2_kl_mean", "k3_kl_mean"))),
        ("ratio mean / std / min / max", " / ".join(fmt_value(ir[k]) for k in ("mean", "std", "min", "max"))),
        (
            "ratio p1 / p50 / p99",
            " / ".join(fmt_value((ir.get("quantiles") or {}).get(k)) for k in ("p1", "p50", "p99")),
        ),
        (
            "ratio ESS (fraction) / chi2",
            f"{fmt_value(ir['ess'])} ({fmt_value(ir['ess_fraction'])}) / {fmt_value(ir['chi2'])}",
        ),
        ("sequences with a mismatch", f"{sq['sequences_with_mismatch']} ({_pct(sq['mismatch_fraction'])})"),
        (
            "seq sum d mean / |.| mean / |.| max",
            " / ".join(fmt_value(sq[k]) for k in ("sum_diff_mean", "sum_diff_abs_mean", "sum_diff_abs_max")),
        ),
        (
            "seq log-ppl diff mean / |.| max",
            f"{fmt_value(sq['log_ppl_diff_mean'])} / {fmt_value(sq['log_ppl_diff_abs_max'])}",
        ),
        (
            "first divergence min / p50 / mean / max",
            " / ".join(fmt_value(fd[k]) for k in ("min", "p50", "mean", "max")),
        ),
    ]
    return rows + framework_rows(r.get("frameworks"))


def framework_rows(fw: dict | None) -> list[tuple[str, str]]:
    """The summary's lines of the RL frameworks' metrics (docs/audit.md, "Framework metrics")."""
    if not fw:
        return []
    verl, nemo = fw["verl"], fw["nemo_rl"]
    tok = verl["rollout_is_token"] or {}
    seq = verl["rollout_is_sequence"] or {}
    off = verl["offpolicy"] or {}
    rs = verl["rollout_rs"] or {}
    pre = "rollout_corr/"
    thr = verl["config"]["rollout_is_threshold"]
    rows = [
        (
            f"verl rollout_is mean token / seq (T={thr:g})",
            f"{fmt_value(tok.get(pre + 'rollout_is_mean'))} / {fmt_value(seq.get(pre + 'rollout_is_mean'))}",
        ),
        (
            "verl is fraction_high / low (token)",
            f"{fmt_value(tok.get(pre + 'rollout_is_ratio_fraction_high'))} / "
            f"{fmt_value(tok.get(pre + 'rollout_is_ratio_fraction_low'))}",
        ),
        ("verl kl / k3_kl / ppl_ratio", " / ".join(fmt_value(off.get(pre + k)) for k in ("kl", "k3_kl", "ppl_ratio"))),
    ]
    if verl["config"]["rollout_rs"]:
        rows.append(
            (
                f"verl rs masked tokens / seqs ({verl['config']['rollout_rs']})",
                f"{fmt_value(rs.get(pre + 'rollout_rs_masked_fraction'))} / "
                f"{fmt_value(rs.get(pre + 'rollout_rs_seq_masked_fraction'))}",
            )
        )
    rows.append(("NeMo-RL token_mult_prob_error", fmt_value(nemo["token_mult_prob_error"])))
    return rows


def format_summary(report: dict, max_issues: int = 10) -> str:
    """The terminal summary: a two-column table, then the first excluded sequences."""
    rows = summary_rows(report)
    width = max(len(k) for k, _ in rows)
    lines = ["detsample audit: " + ", ".join(report["sources"] or ["<records>"])]
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    line = (report.get("diagnosis") or {}).get("line")
    if line:
        lines.append(line)
    if report["excluded_sequences"]:
        kinds = ", ".join(f"{k}: {v}" for k, v in report["excluded_by_kind"].items())
        lines.append(f"excluded sequences ({kinds}):")
        for it in report["issues"][:max_issues]:
            loc = f"line {it['line']}" if "line" in it else f"row {it['row']}"
            lines.append(f"  {it['source']}:{loc}: {it['field']}: {it['message']}")
        more = report["excluded_sequences"] - min(max_issues, len(report["issues"]))
        if more > 0:
            lines.append(f"  ... and {more} more (see the JSON report)")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ plots


def figure(width: float = 7, height: float = 4):
    """A matplotlib Figure on its own Agg canvas (no pyplot, no global backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def bucket_series(rows: list[dict]) -> list[tuple[str, str, list]]:
    """(label, line style, values) of a bucket plot: mean |d|, max |d| and the signed
    mean d (its sign tells a sharper or flatter engine distribution from noise)."""
    return [
        ("mean |d|", "o-", [r["mean_abs_diff"] for r in rows]),
        ("max |d|", "s--", [r["max_abs_diff"] for r in rows]),
        ("mean d (signed)", "^:", [r["mean_diff"] for r in rows]),
    ]


def _bucket_plot(rows: list[dict], title: str, xlabel: str, path: str) -> None:
    fig = figure()
    ax = fig.add_subplot(1, 1, 1)
    labels = [r["bucket"] for r in rows]
    x = list(range(len(rows)))
    for label, style, values in bucket_series(rows):
        ax.plot(x, values, style, label=label)
    ax.axhline(0.0, color="black", linewidth=0.5)
    ax.set_yscale("symlog", linthresh=1e-9)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("d = trainer - engine (nats; symlog)")
    ax2 = ax.twinx()
    ax2.bar(x, [r["mismatch_fraction"] for r in rows], alpha=0.2, color="gray", label="mismatch fraction")
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("fraction of tokens with d != 0")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def save_figure(fig, path: str) -> None:
    """``fig`` as a PNG at exactly ``path``, atomically (:func:`detsample.outputs.write_file`)."""
    write_file(path, lambda fh: fig.savefig(fh, format="png"), "--report")


def has_plots(report: dict) -> bool:
    """Whether the audit has a token with d != 0 (an exact or empty audit has nothing to
    plot: its histogram would be empty and its d curves flat at 0)."""
    return int(report.get("tokens") or 0) > int(report["abs_diff_histogram"]["zero"])


def write_plots(report: dict, out_dir: str) -> list[str]:
    """Write the three PNG plots (none, and any left by an earlier report in ``out_dir``
    removed, when :func:`has_plots` is false); returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, p) for p in PLOTS]
    if not has_plots(report):
        for p in paths:
            if os.path.lexists(p):
                os.remove(p)
        return []
    h = report["abs_diff_histogram"]
    fig = figure()
    ax = fig.add_subplot(1, 1, 1)
    edges = h["edges"]
    ax.bar(
        edges[:-1], h["counts"], width=[b - a for a, b in zip(edges[:-1], edges[1:])], align="edge", edgecolor="black"
    )
    ax.set_xscale("log")
    ax.set_xlabel("|d| = |trainer - engine| (nats)")
    ax.set_ylabel("tokens")
    ax.set_title(
        f"|d| histogram ({h['zero']} tokens with d == 0 not shown; "
        f"{h['below_first_edge']} below, {h['at_or_above_last_edge']} above range)",
        fontsize=8,
    )
    fig.tight_layout()
    save_figure(fig, paths[0])
    _bucket_plot(report["by_position"], "d against response position", "position", paths[1])
    _bucket_plot(report["by_probability"], "d against engine probability", "engine probability bucket", paths[2])
    return paths


# ------------------------------------------------------------------------------ HTML


def _table(header: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt_value(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(title: str, name: str, report: dict) -> str:
    """A plot's heading and image, or a line saying why there is none."""
    if has_plots(report):
        return f"<h2>{html.escape(title)}</h2><img src='{name}'>"
    return (
        f"<h2>{html.escape(title)}</h2><p>no plot: every audited token has d == 0 "
        f"({int(report.get('tokens') or 0)} tokens)</p>"
    )


def with_token_text(report: dict, tokenizer) -> None:
    """Add ``"token"``, the text of ``token_id`` (``tokenizer.decode``), to each of the
    report's ``first_mismatches``; nothing without a tokenizer."""
    if tokenizer is None:
        return
    for w in report.get("first_mismatches", []):
        w["token"] = tokenizer.decode([w["token_id"]])


def _mismatch_table(report: dict) -> str:
    rows = report.get("first_mismatches", [])
    text = any("token" in w for w in rows)
    cols = [
        "sequence id",
        "position",
        "token id",
        *(["token"] if text else []),
        "engine logprob",
        "trainer logprob",
        "d",
    ]
    return _table(
        cols,
        [
            [
                w["id"],
                w["position"],
                w["token_id"],
                *([repr(w.get("token", ""))] if text else []),
                w["engine_logprob"],
                w["trainer_logprob"],
                w["diff"],
            ]
            for w in rows
        ],
    )


def write_report(report: dict, out_dir: str) -> str:
    """Write ``index.html``, the plots and ``report.json`` into out_dir; returns the page."""
    from detsample.audit.running.run import to_json

    write_plots(report, out_dir)
    write_file(os.path.join(out_dir, "report.json"), to_json(report), "--report")
    bucket_cols = [
        "bucket",
        "tokens",
        "exact_match_fraction",
        "mismatch_fraction",
        "mean_abs_diff",
        "mean_diff",
        "max_abs_diff",
    ]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>detsample audit</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}</style></head><body>",
        "<h1>detsample audit</h1>",
        f"<p>{html.escape(', '.join(report['sources']) or '<records>')}</p>",
        _verdict_html(report.get("gates")),
        _diagnosis_html(report.get("diagnosis")),
        "<h2>Summary</h2>",
        _table(["metric", "value"], [list(r) for r in summary_rows(report)]),
        _img("|d| histogram", PLOTS[0], report),
        _img("By response position", PLOTS[1], report),
        _table(bucket_cols, [[r[c] for c in bucket_cols] for r in report["by_position"]]),
        _img("By engine probability", PLOTS[2], report),
        _table(bucket_cols, [[r[c] for c in bucket_cols] for r in report["by_probability"]]),
        f"<h2>First mismatching tokens ({len(report.get('first_mismatches', []))} shown)</h2>",
        _mismatch_table(report),
        f"<h2>Sequences (first {len(report.get('sequences_table', []))})</h2>",
        _table(
            ["sequence id", "tokens", "exact matches", "max |d|", "sum d", "first divergence"],
            [
                [w["id"], w["tokens"], w["exact_matches"], w["max_abs_diff"], w["sum_diff"], w["first_divergence"]]
                for w in report.get("sequences_table", [])
            ],
        ),
        "<h2>Worst sequences</h2>",
        _table(
            ["source", "location", "id", "max_abs_diff", "sum_diff", "first_divergence"],
            [
                [
                    w["source"],
                    w.get("line", w.get("row")),
                    w["id"],
                    w["max_abs_diff"],
                    w["sum_diff"],
                    w["first_divergence"],
                ]
                for w in report["worst_sequences"]
            ],
        ),
        f"<h2>Excluded sequences ({report['excluded_sequences']})</h2>",
        _table(
            ["source", "location", "field", "kind", "message"],
            [[i["source"], i.get("line", i.get("row")), i["field"], i["kind"], i["message"]] for i in report["issues"]],
        ),
        _provenance_html(report.get("provenance")),
        "<h2>Metric definitions</h2>",
        _definitions_html(),
        "<p>Full data: <a href='report.json'>report.json</a></p></body></html>",
    ]
    page = os.path.join(out_dir, "index.html")
    write_file(page, "\n".join(parts) + "\n", "--report")
    return page


#: the metrics of the page, defined on the page (it must read without the docs)
DEFINITIONS = (
    (
        "d",
        "trainer logprob - engine logprob of one audited token (mask 1), in nats, after "
        "both are rounded to the compare dtype",
    ),
    ("exact match", "the two logprobs have the same bits (d == 0 and the same sign of zero)"),
    ("exact_match_fraction", "exact matches / audited tokens"),
    ("mismatch |d| > x", "fraction (count) of audited tokens with |d| above x"),
    ("|d| mean / std / max, quantiles", "over audited tokens, sums computed exactly"),
    (
        "d mean / min / max",
        "the signed d: its sign tells a sharper (d > 0 on improbable "
        "tokens) from a flatter engine distribution, and from noise",
    ),
    (
        "KL k1 / k2 / k3",
        "means of -d, d^2 / 2 and (r - 1) - d: the estimators of KL(engine || trainer) from samples of the engine",
    ),
    ("importance ratio r", "exp(d) = p_trainer / p_engine per token; ESS = (sum r)^2 / sum r^2; chi2 = mean r^2 - 1"),
    ("first divergence", "response position of a sequence's first token with d != 0"),
    ("seq sum d, log-ppl diff", "per sequence: sum of d; -(sum of d) / audited tokens"),
    ("by engine probability", "tokens bucketed by exp(engine logprob)"),
    (
        "semantics",
        "which logprob semantics (raw or processed; temperature; top-k / top-p / "
        "min-p) explains the engine's numbers (the diagnosis)",
    ),
    (
        "gates",
        "--max-abs-diff, --min-exact-match, --max-excluded: the verdict is FAIL when "
        "one is not met, or when no token was audited",
    ),
)


def _definitions_html() -> str:
    items = "".join(f"<dt><b>{html.escape(k)}</b></dt><dd>{html.escape(v)}</dd>" for k, v in DEFINITIONS)
    return f"<dl>{items}</dl>"


def _verdict_html(gates: dict | None) -> str:
    if not gates:
        return "<p><b>Gates: not checked</b> (a report of the Python API)</p>"
    verdict = gates["verdict"]
    color = {"pass": "#070", "fail": "#b00"}.get(verdict, "#555")
    given = ", ".join(
        f"{k} {v}"
        for k, v in gates.items()
        if k in ("max_abs_diff", "min_exact_match", "max_excluded") and v is not None
    )
    fails = "".join(f"<li>{html.escape(f)}</li>" for f in gates["failures"])
    return (
        f"<h2 style='color:{color}'>Verdict: {html.escape(verdict.upper())}</h2>"
        f"<p>gates: {html.escape(given or 'none given')}</p>" + (f"<ul>{fails}</ul>" if fails else "")
    )


def _diagnosis_html(dg: dict | None) -> str:
    if not dg:
        return ""
    if not dg.get("needed"):
        return f"<p>semantics: max |d| is within kernel noise (&lt;= {dg['noise_bound']:g}); nothing to explain</p>"
    sig = dg["signature"]
    rows = [[b, d] for b, d in sig["by_probability"].items()]
    # a model search that named the semantics supersedes the model-free guess
    guess = "" if dg.get("explained") else f": {html.escape(sig['suggests'])}"
    return (
        "<h2>Why the numbers differ</h2>"
        f"<p><b>{html.escape(dg['line'])}</b></p>"
        f"<p>signature (signed mean d by engine probability; {html.escape(sig['pattern'])})"
        f"{guess}</p>" + _table(["bucket", "mean d"], rows)
    )


def _provenance_html(prov: dict | None) -> str:
    if not prov:
        return ""
    flat: list[list[object]] = []

    def walk(prefix: str, v: object) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), x)
        else:
            flat.append([prefix, v if not isinstance(v, (list, tuple)) else repr(v)])

    walk("", prov)
    return "<h2>Provenance</h2>" + _table(["what", "value"], flat)
