"""The speculative-decoding benchmark's plumbing (detsample/benchmarks/speculative.py) on
sizes small enough for the default suite.

Pins: a benchmark that times speculative runs without checking they are the plain run
(it must raise on a difference), and an acceptance figure that is not the run's.
"""

from __future__ import annotations

import pytest

from detsample.benchmarks import speculative as bench


def test_rows_are_measured_and_the_same_model_agrees():
    rows = bench.measure(B=2, steps=4, ks=[2], drafts=["same", "ngram"], rounds=1)
    assert [(r["draft"], r["k"]) for r in rows] == [("same", 2), ("ngram", 2)]
    assert rows[0]["acceptance"] > 0.9 and rows[0]["steps"] < 1.0
    assert all(r["time"] > 0 for r in rows)


def test_a_run_that_changes_a_token_raises(monkeypatch):
    from detsample.refmodel import engine as engine_mod

    real = engine_mod.Engine._record

    def record(self, row, i, s, extra, batch, held):
        if self.speculative is not None:
            s.token_ids[i] = (s.token_ids[i] + 1) % 512
        return real(self, row, i, s, extra, batch, held)

    monkeypatch.setattr(engine_mod.Engine, "_record", record)
    with pytest.raises(AssertionError, match="draft 'ngram', k=2"):
        bench.measure(B=1, steps=3, ks=[2], drafts=["ngram"], rounds=1)
