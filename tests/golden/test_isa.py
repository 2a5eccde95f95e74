"""Tests of detsample/golden/isa.py: the CPU instruction sets this machine can run."""

from __future__ import annotations

import sys

import pytest
import torch

from detsample.golden import isa


def test_supported_sets_are_ordered_and_include_the_current_one():
    ok = isa.supported_isas()
    assert ok[0] == "default" and isa.current_isa() in ok
    assert ok == [i for i in isa.X86_ORDER if i in ok] or not isa._is_x86()


@pytest.mark.skipif(not isa._is_x86(), reason="x86-64 instruction sets")
def test_a_set_the_cpu_lacks_is_never_offered(monkeypatch):
    """Bug pinned: ATEN_CPU_CAPABILITY=avx512 on an AVX2 CPU dies on an illegal
    instruction (torch accepts the variable), so support comes from the CPU flags."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx2_supported", lambda: True)
    assert isa.supported_isas() == ["default", "avx2"] and isa.native_isa() == "avx2"
    with pytest.raises(ValueError, match="got 'avx512'"):
        isa.resolve("avx512")
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: True)
    assert isa.resolve("all") == ["default", "avx2", "avx512"]


@pytest.mark.parametrize(
    "value,problem",
    [
        (None, None),
        ("", None),
        ("default", None),
        ("avx2", None),
        ("avx512", "ATEN_CPU_CAPABILITY=avx512: this CPU supports default, avx2"),
        ("AVX2", "ATEN_CPU_CAPABILITY=AVX2: this CPU supports default, avx2"),
        ("avx9000", "ATEN_CPU_CAPABILITY=avx9000: this CPU supports default, avx2"),
    ],
)
def test_a_forced_set_is_a_problem_unless_the_cpu_runs_it(monkeypatch, value, problem):
    """What every ``detsample`` command refuses up front (detsample/cli/__init__.py): a set
    the CPU lacks (torch would run its kernels: an illegal instruction) or a value torch
    does not know (it would run another set than the one asked for)."""
    monkeypatch.setattr(isa, "_is_x86", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx2_supported", lambda: True)
    if value is None:
        monkeypatch.delenv(isa.ENV, raising=False)
    else:
        monkeypatch.setenv(isa.ENV, value)
    assert isa.forced_isa_problem() == problem


@pytest.mark.parametrize(
    "value,sets", [("sve256", ["default", "sve256"]), ("", ["default", "sve256"]), ("default", ["default"])]
)
def test_off_x86_a_forced_set_torch_took_is_supported(monkeypatch, value, sets):
    """Bug pinned: off x86 any forced value dropped the CPU's own set from the list, so
    ``ATEN_CPU_CAPABILITY=sve256`` on an SVE256 CPU (torch checks that set itself) would
    be refused."""
    monkeypatch.setattr(isa, "_is_x86", lambda: False)
    monkeypatch.setattr(isa, "current_isa", lambda: value or "sve256")
    monkeypatch.setenv(isa.ENV, value)
    assert isa.supported_isas() == sets and isa.forced_isa_problem() is None


def test_resolve():
    assert isa.resolve("all") == isa.supported_isas()
    assert isa.resolve("current") == [isa.current_isa()]
    assert isa.resolve("default") == ["default"]
    with pytest.raises(ValueError, match="isa must be 'all', 'current' or sets"):
        isa.resolve("sse9")


def test_dispatch_info_matches_describe():
    info = isa.dispatch_info()
    assert info["machine_isa"] == isa.native_isa()
    assert info["mode"] == ("native" if isa.current_isa() == isa.native_isa() else "emulated")
    assert info["mode"] in isa.describe()


def test_run_per_isa_sets_the_variable_per_child():
    lines: list[str] = []
    argv = [sys.executable, "-c", "import os; print('got', os.environ['ATEN_CPU_CAPABILITY'])"]
    res = isa.run_per_isa(["default", "default"], argv, lines.append)
    assert res == [("default", 0), ("default", 0)]
    assert lines.count("got default") == 2 and lines[-1] == "==> per ISA: default ok, default ok"
    res = isa.run_per_isa(["default"], [sys.executable, "-c", "raise SystemExit(3)"], lines.append)
    assert res == [("default", 3)] and lines[-1].endswith("default FAILED (exit 3)")
