"""detsample/benchmarks/sampler.py: the bench's cases, op counts and table (timings are
never asserted)."""

from __future__ import annotations

import torch

from detsample.benchmarks import sampler as bm


def test_count_ops_counts_torch_operator_calls():
    x = torch.ones(3)
    assert bm.count_ops(lambda: (x + 1).mul_(2).sum()) == 3
    assert bm.count_ops(lambda: None) == 0


def test_peaked_logits_have_a_small_nucleus():
    """The "peaked" family is what the top-p figures are measured on: a head of a few
    tokens holds 90% of the mass at T = 0.8 (the flat "gaussian" family does not)."""
    for family, small in (("peaked", True), ("gaussian", False)):
        x = bm.make_logits(bm.Case(4, 32000, "topp0.9_T0.8", family))
        p = torch.softmax(x / 0.8, -1).sort(-1, descending=True).values
        size = (p.cumsum(-1) < 0.9).sum(-1) + 1
        assert bool((size <= 64).all()) == small, (family, size.tolist())


def test_markdown_has_one_line_per_case_with_ratios():
    rows = [
        dict(B=1, V=64, config="T0.8", logits="peaked", path=p, median_ms=ms, min_ms=ms / 2, ops=7)
        for p, ms in (
            ("detsample", 1.0),
            ("SGLang deterministic (eager)", 4.0),
            ("vLLM seeded", 2.0),
            ("SGLang shortcut", 0.5),
            ("vLLM unseeded", 1.0),
            (bm.BARE_LOG_SOFTMAX, 0.25),
        )
    ]
    text = bm.markdown(rows)
    assert text.splitlines()[0].endswith("| detsample / bare log_softmax |")
    line = text.splitlines()[2]
    assert line.startswith("| 64 | 1 | T0.8 | 7 | 1 | 4 | 2 | 0.5 | 1 | 0.25 |")
    assert line.endswith("| 0.50x | 2.00x | 4.00x |")
    low = bm.markdown(rows, "min_ms").splitlines()[2]
    assert low.startswith("| 64 | 1 | T0.8 | 7 | 0.5 | 2 | 1 | 0.25 | 0.5 |")
    no_bare = bm.markdown([r for r in rows if r["path"] != bm.BARE_LOG_SOFTMAX])
    assert no_bare.splitlines()[2].endswith("| 0.50x | 2.00x |  |")


def test_run_reports_milliseconds(monkeypatch):
    """Bug pinned: the median and minimum were scaled to ms twice (microseconds in the
    table). A call that sleeps 20 ms must read as about 20, never 20000."""
    import time

    monkeypatch.setattr(bm, "paths", lambda *a, **k: {"detsample": lambda: time.sleep(0.02)})
    (row,) = bm.run(batches=(1,), vocabs=(64,), configs=("greedy",), repeat=2, compile_sglang=False)
    assert 15 < row["min_ms"] <= row["median_ms"] < 1000
