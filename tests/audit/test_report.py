"""Audit summary table, HTML page and plots (detsample/auditreport.py)."""

from __future__ import annotations

import matplotlib

from detsample.audit import audit
from detsample.audit.report import PLOTS, format_summary, write_report
from detsample.audit.synth import synth_rollouts, to_records

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
    """Pins plotting of degenerate inputs: all-zero |d| and no tokens at all."""
    exact = audit(to_records(synth_rollouts(10, seed=4, mismatch_rate=0.0)))
    write_report(exact, str(tmp_path / "a"))
    empty = audit([])
    write_report(empty, str(tmp_path / "b"))
    assert "0 audited" in format_summary(empty)


def test_summary_lists_excluded_sequences():
    recs = [{"id": "x", "prompt_ids": [1], "response_ids": [1], "engine_logprobs": [1.0],
             "trainer_logprobs": [-1.0]}]
    text = format_summary(audit(recs))
    assert "positive_logprob: 1" in text and "<records>:row 0: engine_logprobs:" in text
