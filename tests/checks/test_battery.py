"""Tests of detsample/battery.py: aggregation and the external-check protocol."""

from __future__ import annotations

import sys
import types

import pytest

from detsample.checks import battery
from detsample.checks.result import CheckResult
from detsample.golden.store import GoldenStore

ONE = ["ties.greedy"]


def test_external_checks_are_run_and_normalised():
    """Bug pinned: an external (refmodel) check failing without failing the battery."""
    calls = []

    def good(quick, device):
        calls.append((quick, device))
        return CheckResult("refmodel_alignment", True, "ok")

    def bad(quick, device):
        return (False, "decode != prefill at position 3")

    def boom(quick, device):
        raise RuntimeError("kaput")

    res = battery.run_battery(quick=True, names=ONE, external=[("good", good), ("bad", bad), ("boom", boom)])
    by = {r.name: r for r in res}
    assert calls == [(True, "cpu")]
    assert by["refmodel_alignment"].ok and not by["bad"].ok and "position 3" in by["bad"].detail
    assert not by["boom"].ok and "kaput" in by["boom"].detail
    assert [r.name for r in res[:5]] == list(battery.SCENARIO_CHECKS)


def test_external_module_discovery(monkeypatch):
    mod = types.ModuleType("fake_checks_mod")

    def check_x(quick, device):
        return True

    check_x.check_name = "x"
    mod.CHECKS = [check_x]
    monkeypatch.setitem(sys.modules, "fake_checks_mod", mod)
    found = battery.external_checks(("fake_checks_mod", "surely_absent_pkg.checks"))
    assert [n for n, _ in found] == ["x"]


BROKEN = [
    ("import_dep", "import surely_absent_dependency_xyz\n", ModuleNotFoundError),
    ("raises", "raise RuntimeError('bad init')\n", RuntimeError),
]


@pytest.mark.parametrize("name,src,exc", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_external_module_is_a_failure(tmp_path, monkeypatch, name, src, exc):
    """Bug pinned: an import error inside the refmodel checks silently skipping them."""
    (tmp_path / f"broken_{name}.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert battery.external_checks(("absent_pkg_qq.checks",)) == []  # absent: not run
    ((_, fn),) = battery.external_checks((f"broken_{name}",))
    with pytest.raises(exc):
        fn(quick=True, device="cpu")


def test_scenario_exception_is_reported(monkeypatch):
    from detsample.golden import registry

    sc = registry.get(ONE[0])
    monkeypatch.setattr(type(sc), "produce", lambda self, **kw: 1 / 0)
    res = battery.run_battery(names=ONE, external=[])
    assert not any(r.ok for r in res) and "ZeroDivisionError" in res[1].detail


def test_missing_scenario_golden_fails(tmp_path):
    """A newly registered scenario without a golden must fail until goldens are updated."""
    store = GoldenStore(tmp_path)
    store.update(
        {"random.greedy": __import__("detsample.golden.registry").golden.registry.get("random.greedy").produce()}
    )
    (res, *_) = battery.run_battery(names=ONE, store=store, external=[])
    assert not res.ok and not res.skipped and "no golden for scenario 'ties.greedy'" in res.detail
