"""Audit summary table, HTML page and plots (detsample/auditreport.py)."""

from __future__ import annotations

import matplotlib
import pytest

from detsample.audit import audit
from detsample.audit.reports.report import PLOTS, format_summary, write_report
from detsample.params import SamplingParams as SP
from tests.audit.synth import synth_rollouts, to_records

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_write_report_writes_page_and_pngs_without_touching_backend(tmp_path):
    """Pins 'no global state': the plots use the Agg canvas, the backend is unchanged."""
    before = matplotlib.get_backend()
    rep = audit(to_records(synth_rollouts(30, seed=4)))
    page = write_report(rep, str(tmp_path / "r"))
    assert matplotlib.get_backend() == before
    text = open(page).read()
    for name in PLOTS:
        assert f"src='{name}'" in text
        assert (tmp_path / "r" / name).read_bytes()[:8] == PNG_MAGIC
    assert "exact_match_fraction" in text and "Worst sequences" in text


def test_report_of_exact_and_empty_audits(tmp_path):
    """Pins plotting of degenerate inputs (all-zero |d), and the bug that an exact audit
    drew an empty |d| histogram with a y axis of -0.04..0.04 "tokens": no plot is drawn
    (one left by an earlier report in the folder is removed), the page says why."""
    out = tmp_path / "a"
    write_report(audit(to_records(synth_rollouts(30, seed=4))), str(out))
    assert (out / PLOTS[0]).exists()
    exact = audit(to_records(synth_rollouts(10, seed=4, mismatch_rate=0.0)))
    text = open(write_report(exact, str(out))).read()
    assert not any((out / name).exists() for name in PLOTS)
    assert "<img" not in text and "every audited token has d == 0" in text
    empty = audit([])
    write_report(empty, str(tmp_path / "b"))
    assert "0 audited" in format_summary(empty)


def test_summary_lists_excluded_sequences():
    recs = [{"id": "x", "prompt_ids": [1], "response_ids": [1], "engine_logprobs": [1.0], "trainer_logprobs": [-1.0]}]
    text = format_summary(audit(recs))
    assert "positive_logprob: 1" in text and "<records>:row 0: engine_logprobs:" in text


def _cli_report(tmp_path, *gate):
    import json

    from detsample.cli import main
    from tests.audit.synth import synth_rollouts as synth
    from tests.audit.synth import write_jsonl

    path = tmp_path / "r.jsonl"
    write_jsonl(synth(6, seed=3, mean_len=8, mismatch_rate=0.5), str(path))
    out = tmp_path / "rep"
    rc = main(["audit", str(path), "--report", str(out), "--quiet", *gate])
    return rc, json.loads((out / "report.json").read_text()), (out / "index.html").read_text()


VERDICTS = [  # (gate arguments, exit code, verdict)
    ([], 0, "no gate"),
    (["--max-abs-diff", "10"], 0, "pass"),
    (["--max-abs-diff", "0"], 1, "fail"),
]


@pytest.mark.parametrize("gate,rc,verdict", VERDICTS)
def test_report_carries_the_verdict_and_provenance(tmp_path, gate, rc, verdict):
    """Bug pinned: report.json and index.html recorded neither the gate verdict (a failing
    run's page looked like a passing one) nor what produced them."""
    got_rc, rep, page = _cli_report(tmp_path, *gate)
    assert got_rc == rc and rep["gates"]["verdict"] == verdict
    assert f"Verdict: {verdict.upper()}" in page
    if verdict == "fail":
        assert rep["gates"]["failures"][0].startswith("max_abs_diff")
        assert "max_abs_diff = " in page
    prov = rep["provenance"]
    assert prov["detsample_version"] and prov["platform"]["torch"] and prov["rescore"] is None
    assert "detsample_version" in page and "Metric definitions" in page
    assert "KL k1 / k2 / k3" in page and "docs/audit.md" not in page  # defined on the page


def test_rescore_provenance_names_model_and_semantics(tmp_path):
    import json

    from detsample.audit.running.rollout import generate_rollouts
    from detsample.cli import main

    path = tmp_path / "r.jsonl"
    path.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in generate_rollouts(
                num_sequences=2, max_new_tokens=4, sampling=SP(temperature=0.7, top_p=0.9), logprobs_mode="processed"
            )
        )
    )
    assert (
        main(
            [
                "audit",
                str(path),
                "--rescore",
                "refmodel",
                "--logprobs-mode",
                "processed",
                "--temperature",
                "0.7",
                "--top-p",
                "0.9",
                "--json",
                str(tmp_path / "a.json"),
                "--quiet",
            ]
        )
        == 0
    )
    prov = json.loads((tmp_path / "a.json").read_text())["provenance"]
    resc = prov["rescore"]
    assert resc["model"] == "refmodel" and resc["semantics"]["top_p"] == 0.9
    # the bug: a report named the factory but not the weights, the command or the time
    from detsample.models import load_model
    from detsample.models.digest import weights_digest

    assert resc["weights_sha256"] == weights_digest(load_model("refmodel"))
    assert prov["command"][:3] == ["detsample", "audit", str(path)]
    assert prov["created"].endswith("+00:00")
    assert resc["semantics_flags"] == "--logprobs-mode processed --temperature 0.7 --top-p 0.9"


def test_first_mismatches_and_sequence_tables():
    recs = [
        {
            "id": "a",
            "response_ids": [5, 6, 7],
            "engine_logprobs": [-1.0, -2.0, -3.0],
            "trainer_logprobs": [-1.0, -2.5, -3.0],
        },
        {
            "id": "b",
            "response_ids": [8, 9],
            "engine_logprobs": [-0.5, -0.25],
            "trainer_logprobs": [-0.75, -0.25],
            "mask": [1, 1],
        },
    ]
    rep = audit(recs)
    assert rep["first_mismatches"] == [
        {"id": "a", "position": 1, "token_id": 6, "engine_logprob": -2.0, "trainer_logprob": -2.5, "diff": -0.5},
        {"id": "b", "position": 0, "token_id": 8, "engine_logprob": -0.5, "trainer_logprob": -0.75, "diff": -0.25},
    ]
    assert [(s["id"], s["tokens"], s["exact_matches"], s["first_divergence"]) for s in rep["sequences_table"]] == [
        ("a", 3, 2, 1),
        ("b", 2, 1, 0),
    ]


def test_signed_mean_d_is_plotted():
    """Bug pinned: the plots showed |mean d|, hiding the sign that tells a temperature from
    noise; the probability plot's series carry the signed mean d."""
    from detsample.audit.reports.report import bucket_series

    rows = [
        {"mean_abs_diff": 0.3, "max_abs_diff": 0.5, "mean_diff": 0.3},
        {"mean_abs_diff": 0.7, "max_abs_diff": 0.9, "mean_diff": -0.7},
    ]
    series = {label: values for label, _, values in bucket_series(rows)}
    assert series["mean d (signed)"] == [0.3, -0.7]
