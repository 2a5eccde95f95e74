"""AuditLog over a training run: one row per step, the metrics plotted over steps, a gate
on the latest step (detsample/audit/reports/log.py, detsample/cli/audit_log.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from detsample.audit import AuditInputError, AuditLog, from_tensors, read_log
from detsample.audit.reports.log import LOG_PLOT, check_log_gates
from detsample.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = 50


def _step_batch(rng: np.random.Generator, step: int):
    """A padded batch whose engine/trainer mismatch grows by 10 % per step."""
    b, r = 8, 48
    e = np.log(rng.random((b, r)) * 0.999 + 1e-3).astype(np.float32)
    scale = 1e-4 * 1.1**step
    noise = rng.normal(size=(b, r)) * scale * (rng.random((b, r)) < 0.5)
    t = np.minimum(e + noise, 0).astype(np.float32)
    lens = rng.integers(r // 2, r + 1, b)
    m = (np.arange(r)[None, :] < lens[:, None]).astype(np.int64)
    ids = rng.integers(0, 1000, (b, r))
    return [torch.from_numpy(x) for x in (ids, e, t, m)]


@pytest.fixture(scope="module")
def run_log(tmp_path_factory):
    path = tmp_path_factory.mktemp("run") / "logs" / "audit.jsonl"
    log = AuditLog(path)
    rng = np.random.default_rng(0)
    reports = [log.audit_tensors(*_step_batch(rng, s)) for s in range(STEPS)]
    return str(path), reports


def test_one_row_per_step_with_the_report_metrics(run_log):
    path, reports = run_log
    rows = read_log(path)
    assert [r["step"] for r in rows] == list(range(STEPS))
    for row, rep in zip(rows, reports):
        assert row["mean_abs_diff"] == rep["mean_abs_diff"]
        assert row["max_abs_diff"] == rep["max_abs_diff"]
        assert row["k3_kl_mean"] == rep["k3_kl_mean"]
        assert row["mismatch_fraction"] == rep["mismatch_fraction"]["0"]
        assert row["ratio"]["p99"] == rep["importance_ratio"]["quantiles"]["p99"]


def test_the_growing_mismatch_shows_in_the_log(run_log):
    """Pins the run-level question: the mismatch grows ~117x over 50 steps (1.1**50); the
    log's first and last steps show it, per metric."""
    rows = read_log(run_log[0])
    first, last = rows[0], rows[-1]
    for key in ("mean_abs_diff", "max_abs_diff", "abs_diff_p99"):
        assert last[key] > 30 * first[key]
    assert last["k3_kl_mean"] > 900 * first["k3_kl_mean"]  # k3 ~ d^2 / 2
    assert last["ratio"]["p99"] - 1 > 30 * (first["ratio"]["p99"] - 1)
    mean = np.array([r["mean_abs_diff"] for r in rows])
    assert np.corrcoef(np.arange(STEPS), np.log(mean))[0, 1] > 0.98


def test_audit_log_cli_draws_and_gates_the_latest_step(run_log, tmp_path, capsys):
    path = run_log[0]
    rows = read_log(path)
    out = tmp_path / "rep"
    assert main(["audit-log", path, "--report", str(out)]) == 0
    assert (out / LOG_PLOT).read_bytes()[:8] == PNG_MAGIC
    page = (out / "index.html").read_text()
    assert f"src='{LOG_PLOT}'" in page and page.count("<tr>") == STEPS + 1
    text = capsys.readouterr().out
    assert f"{STEPS} steps (0 .. {STEPS - 1})" in text and "mean_abs_diff" in text
    limit = (rows[0]["max_abs_diff"] + rows[-1]["max_abs_diff"]) / 2  # passes early, fails late
    assert main(["audit-log", path, "--max-abs-diff", str(limit), "--quiet"]) == 1
    assert f"GATE FAILED: step {STEPS - 1}: max_abs_diff = " in capsys.readouterr().err
    assert (
        main(
            [
                "audit-log",
                path,
                "--max-abs-diff",
                "1",
                "--max-k3",
                "1",
                "--max-mismatch",
                "1",
                "--min-exact-match",
                "0",
                "--quiet",
            ]
        )
        == 0
    )
    assert main(["audit-log", path, "--json", "-", "--quiet"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == STEPS


GATES = [
    # (kwargs, failing metrics)
    (dict(max_abs_diff=0.0), ["max_abs_diff"]),
    (dict(min_exact_match=1.0, max_k3=0.0), ["k3_kl_mean", "exact_match_fraction"]),
    (dict(max_mismatch=1.0, max_abs_diff=1.0), []),
]


@pytest.mark.parametrize("kwargs,failing", GATES)
def test_log_gates_name_step_and_metric(run_log, kwargs, failing):
    failures = check_log_gates(read_log(run_log[0]), **kwargs)
    assert [f.split(": ")[1].split(" ")[0] for f in failures] == failing
    assert all(f.startswith(f"step {STEPS - 1}: ") for f in failures)


def test_steps_continue_after_reopening_and_explicit_steps(tmp_path):
    rep = from_tensors(np.ones((2, 3), dtype=np.int64), np.full((2, 3), -1.0), np.full((2, 3), -1.0))
    log = AuditLog(tmp_path / "a.jsonl")
    log.append(rep)
    log.append(rep, step=10)
    assert AuditLog(tmp_path / "a.jsonl").append(rep)["step"] == 11
    assert [r["step"] for r in read_log(str(tmp_path / "a.jsonl"))] == [0, 10, 11]
    with pytest.raises(ValueError, match="step must be an int"):
        log.append(rep, step=1.5)


def test_bad_logs_are_named(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 0}\n')
    with pytest.raises(AuditInputError, match="line 1: missing tokens"):
        read_log(str(bad))
    bad.write_text("{nope\n")
    assert main(["audit-log", str(bad)]) == 2
    assert "bad.jsonl:line 1: invalid JSON" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["audit-log", str(empty)]) == 2
    assert main(["audit-log", str(tmp_path / "none.jsonl")]) == 2
    assert "cannot read the audit log" in capsys.readouterr().err
