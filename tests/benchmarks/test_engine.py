"""The engine-step benchmark's plumbing (detsample/benchmarks/engine.py), on sizes small
enough for the default suite.

Pins: a run whose step time is not measured (zero or negative), and a check that lets
two rounds draw different tokens pass.
"""

from __future__ import annotations

import pytest

from detsample.benchmarks import engine as bench


def _one_config(monkeypatch):
    monkeypatch.setattr(bench, "CONFIGS", {"topk50_topp0.9_T0.8": bench.CONFIGS["topk50_topp0.9_T0.8"]})


def test_every_round_is_timed(monkeypatch):
    _one_config(monkeypatch)
    rows = bench.measure([2], vocab=512, rounds=2, steps=2)
    assert len(rows) == 1 and 0 < rows[0]["best_ms"] <= rows[0]["step_ms"]


def test_rounds_that_draw_different_tokens_are_an_error(monkeypatch):
    _one_config(monkeypatch)
    real, calls = bench.run_once, []

    def drifting(*args):
        t, toks = real(*args)
        calls.append(1)
        return t, toks if len(calls) == 1 else [list(reversed(x)) + [0] for x in toks]

    monkeypatch.setattr(bench, "run_once", drifting)
    with pytest.raises(AssertionError, match="different tokens"):
        bench.measure([2], vocab=512, rounds=2, steps=2)
