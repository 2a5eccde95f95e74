"""Tests of detsample/scenarios.py: the registry and the scenario runner."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from detsample.golden import registry, scenarios
from detsample.golden.diff import compare
from detsample.golden.scenarios import BIG_VOCAB, PARAM_FAMILIES, Scenario
from detsample.golden.synthlogits import FAMILIES
from detsample.grammar import GrammarConfig
from detsample.grammar import compiler as grammar_compiler


def test_registry_covers_every_family():
    """Bug pinned: a logits or params family silently left out of the goldens."""
    names = registry.names()
    synthetic = [n for n in names if isinstance(registry.get(n), Scenario)]
    assert {n.split(".")[0] for n in synthetic} == set(FAMILIES) | {"big"}
    assert {n for n in synthetic if n.endswith(".grammar")} == {f"{f}.grammar" for f in scenarios.GRAMMAR_LOGITS}
    assert {n.split(".")[1] for n in synthetic} == set(PARAM_FAMILIES)
    quick = registry.names(quick=True)
    assert quick and set(quick) < set(names) and set(quick) >= scenarios.QUICK
    assert any(registry.get(n).vocab == BIG_VOCAB for n in synthetic)
    assert len({registry.get(n).seed for n in names}) == len(names)


def test_every_row_mode_and_seed_is_explicit():
    sc = registry.get("random.combo")
    params = sc.sampling_params()
    assert [p.logprobs_mode for p in params[:3]] == ["raw", "scaled", "processed"]
    assert [p.seed for p in params] == [(sc.seed << 8) | i for i in range(sc.rows)]


def test_produce_is_canonical_and_described():
    sc = Scenario("t", "ties", "combo", vocab=50, rows=4, steps=2, seed=3)
    out = sc.produce()
    assert out.rids == ("r0", "r1", "r2", "r3") * 2
    assert out.positions.tolist() == [sc.position(r, s) for s in range(2) for r in range(4)]
    assert out.meta["rng"] and out.meta["sampler"]["draw_method"]
    assert out.meta["seeds"] == {f"r{i}": p.seed for i, p in enumerate(sc.sampling_params())}
    assert len(out.meta["inputs"]["logits_sha256"]) == 2


def test_run_reorders_any_composition_to_canonical():
    """Bug pinned: comparing a permuted batch entry by entry against the canonical one."""
    sc = Scenario("t", "random", "top_p", vocab=64, rows=5, steps=3, seed=9)
    ref = sc.produce()
    mixed = sc.run(order=[3, 1, 4, 0, 2], split=2, shuffle_steps=True)
    assert compare("t", ref, mixed).ok
    alone = sc.run(order=[2])
    assert alone.rids == ("r2",) * 3 and compare("t", ref.of_request("r2"), alone).ok


def test_on_step_hook_sees_every_step():
    sc = Scenario("t", "random", "greedy", vocab=32, rows=2, steps=3, seed=1)
    seen = []
    sc.run(on_step=lambda step, rows, logits, batch, pos, out: seen.append((step, rows, tuple(logits.shape))))
    assert seen == [(s, [0, 1], (2, 32)) for s in range(3)]


BAD = [
    (dict(logits="nope"), "logits must be one of"),
    (dict(params="nope"), "params must be one of"),
    (dict(rows=0), "rows must be >= 1"),
    (dict(seed=-1), "seed must be in"),
    (dict(params="grammar", vocab=1000), "vocab must be 512"),
]


@pytest.mark.parametrize("kw,msg", BAD)
def test_bad_scenario_rejected(kw, msg):
    base = dict(name="x", logits="random", params="greedy")
    with pytest.raises(ValueError, match=msg):
        Scenario(**{**base, **kw})


def test_unknown_name_lists_known():
    with pytest.raises(KeyError, match="random.combo"):
        registry.get("nope")


def test_finished_rows_leave_the_batch():
    """Bug pinned: sampling a finished row again (a grammar row past its end would then
    be fed a token its matcher rejects)."""
    sc = registry.get("neginf.grammar")
    out = sc.produce()
    assert out.of_request("r0").tokens.tolist() == [-1]  # no admissible token at step 0
    mixed = sc.run(order=list(range(sc.rows))[::-1], split=3, shuffle_steps=True)
    assert compare(sc.name, out, mixed).ok


SLOW_S, IMPATIENT_S = 1.0, 0.2  # a compile 5x longer than the default timeout


@dataclass(frozen=True)
class _Impatient(GrammarConfig):
    """The default options a compiler gets, with a timeout the slowed compile outlasts."""

    compile_timeout_s: float | None = IMPATIENT_S


@pytest.fixture
def slow_compiles(monkeypatch):
    """A loaded machine: every grammar compiles SLOW_S late, past the default timeout
    (IMPATIENT_S standing for the 30 s a compile outlasts there)."""
    real = grammar_compiler.compile_kind

    def slow(*args, **kwargs):
        time.sleep(SLOW_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(grammar_compiler, "compile_kind", slow)
    monkeypatch.setattr(grammar_compiler, "GrammarConfig", _Impatient)


@pytest.mark.parametrize("name", ["engine.grammar", "random.grammar"])
def test_a_compile_slower_than_the_timeout_moves_no_golden(name, request):
    """Pins: under the default 30 s timeout a loaded machine ended engine.grammar's JSON
    request with grammar_error and no tokens; a golden waits for its compilations."""
    sc = registry.get(name)
    fast = sc.produce()
    request.getfixturevalue("slow_compiles")
    slow = sc.produce()
    assert "grammar_error" not in slow.meta.get("finish_reasons", {}).values()
    assert compare(name, fast, slow).ok, compare(name, fast, slow)


def test_a_users_grammar_keeps_its_timeout(slow_compiles):
    """Only the scenarios wait: a user's engine keeps the default timeout (30 s here
    IMPATIENT_S), and a grammar that outlasts it ends its request with grammar_error."""
    from detsample.params import Request, SamplingParams
    from detsample.refmodel import RefModel, RefModelConfig
    from detsample.refmodel.engine import Engine, EngineConfig
    from detsample.refmodel.schedule import Schedule
    from detsample.sampler import Sampler

    assert GrammarConfig().compile_timeout_s == 30.0
    engine = Engine(RefModel(RefModelConfig(seed=0)), Sampler(), EngineConfig())
    res = engine.run(Schedule.of([(0, Request("j", SamplingParams(regex="[a-z]{3}"), [1, 2]))]))
    assert res["j"].finish_reason == "grammar_error" and res["j"].token_ids == ()
