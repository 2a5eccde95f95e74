"""Tests of detsample/enginescenarios.py: engine schedules as golden scenarios."""

from __future__ import annotations

import pytest

from detsample.golden import engine_scenarios as enginescenarios
from detsample.golden import registry
from detsample.golden.diff import compare

needs_engine = pytest.mark.skipif(
    not enginescenarios.available(), reason="detsample.refmodel.engine is not in this build"
)
NAMES = sorted(enginescenarios.ENGINE_SCENARIOS)


def test_registered_exactly_when_engine_exists():
    """Bug pinned: engine scenarios listed (and failing) in a build without the engine."""
    present = set(NAMES) <= set(registry.names())
    absent = not set(NAMES) & set(registry.names())
    assert present if enginescenarios.available() else absent


@needs_engine
@pytest.mark.parametrize("name", NAMES)
def test_produce_is_reproducible_and_labelled(name):
    sc = enginescenarios.ENGINE_SCENARIOS[name]
    a, b = sc.produce(), sc.produce()
    assert compare(name, a, b).ok
    reqs = sc.requests()
    assert set(a.rids) <= {r.rid for r in reqs}
    for r in reqs:
        mine = a.of_request(r.rid)
        start = len(r.prompt_ids) - 1
        assert mine.positions.tolist() == list(range(start, start + len(mine.rids)))
    assert set(a.meta["finish_reasons"]) == {r.rid for r in reqs}


@needs_engine
@pytest.mark.parametrize(
    "name,reasons", [("engine.stops", {"stop", "length"}), ("engine.grammar", {"grammar_terminated"})]
)
def test_scenarios_cover_finish_reasons(name, reasons):
    out = enginescenarios.ENGINE_SCENARIOS[name].produce()
    assert reasons <= set(out.meta["finish_reasons"].values())


def test_engine_scenario_is_cpu_only():
    sc = enginescenarios.ENGINE_SCENARIOS["engine.mixed"]
    with pytest.raises(ValueError, match="device must be 'cpu'"):
        sc.produce(device="cuda")


def test_not_listed_for_cuda():
    assert not set(NAMES) & set(registry.names(device="cuda"))
    assert "random.combo" in registry.names(device="cuda")
