"""The engine-step twin benchmark's plumbing (detsample/benchmarks/engine.py), on sizes
small enough for the default suite.

Pins: a switch that leaves its twin off after the block (the next benchmark, or test,
would time the wrong path), a switch that turns nothing off, and a twin whose "off"
route changes a token (the run compares every variant's tokens and raises).
"""

from __future__ import annotations

import pytest

from detsample.benchmarks import engine as bench


@pytest.mark.parametrize("name", list(bench.TWINS))
def test_a_twin_is_off_inside_the_block_and_back_after(name):
    mod, attr, off = bench.TWINS[name]
    on = getattr(mod, attr)
    assert on is not off
    with pytest.raises(RuntimeError):
        with bench.twin_off(name):
            assert getattr(mod, attr) is off
            raise RuntimeError("restored on an exception too")
    assert getattr(mod, attr) is on


def test_every_variant_draws_the_same_tokens(monkeypatch):
    monkeypatch.setattr(bench, "CONFIGS", {"topk50_topp0.9_T0.8": bench.CONFIGS[
        "topk50_topp0.9_T0.8"]})
    rows = bench.measure([2], vocab=512, rounds=1, steps=2)
    assert len(rows) == 1 and set(rows[0]["ratios"]) == set(bench.TWINS)
    assert rows[0]["step_ms"] > 0
