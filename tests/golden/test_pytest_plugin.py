"""Tests of detsample/pytest_plugin.py: ``pytest --golden-update`` and the ``golden``
fixture, run by pytester (in process) on a throw-away project; the plugin is loaded
through its ``pytest11`` entry point, as for any user."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest_plugins = ["pytester"]
TEST_FILE = """
import os
import numpy as np
from detsample.golden.format import ScenarioOutput

def test_demo(golden):
    bits = int(os.environ.get("DEMO_BITS", "0x3f800000"), 16)
    out = ScenarioOutput(rids=("a", "a"), positions=np.array([4, 5]),
                         tokens=np.array([7, 9]),
                         logprobs=np.array([bits, 0xbf000000], dtype=np.uint32).view(np.float32))
    golden.check("demo", out)
"""


@pytest.fixture
def child(pytester, monkeypatch):
    """Run pytest on the demo test file; returns (returncode, stdout, stderr)."""
    pytester.makepyfile(test_demo=TEST_FILE)

    def run(*args: str, **env: str) -> SimpleNamespace:
        monkeypatch.delenv("CI", raising=False)
        monkeypatch.delenv("DEMO_BITS", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        r = pytester.runpytest(
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:hypothesispytest",
            "--golden-dir",
            str(pytester.path / "golden"),
            *args,
        )
        return SimpleNamespace(returncode=int(r.ret), stdout=r.stdout.str(), stderr=r.stderr.str())

    return run


def demo_dir(tmp_path: Path) -> Path:
    (d,) = (tmp_path / "golden").glob("*/demo")
    return d


def test_missing_platform_is_loud_skip(child):
    """Bug pinned: a fresh platform reporting green without any golden."""
    r = child()
    assert r.stdout.strip().splitlines()[-1].startswith("1 skipped")
    assert "SKIPPED, NOT passed" in r.stdout and "--golden-update" in r.stdout


def test_update_then_compare_then_move(child, pytester):
    r = child("--golden-update")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[new] demo" in r.stdout
    first = {p.name: p.read_bytes() for p in demo_dir(pytester.path).iterdir()}
    r = child("--golden-update")
    assert "0 changed, 1 unchanged" in r.stdout
    assert {p.name: p.read_bytes() for p in demo_dir(pytester.path).iterdir()} == first
    assert child().returncode == 0
    r = child(DEMO_BITS="0x3f800001")  # one ulp
    assert r.returncode == 1
    assert "first divergence: request a position 4" in r.stdout and "1 ulp" in r.stdout
    assert (demo_dir(pytester.path) / "logprobs.txt.obtained").is_file()
    r = child("--golden-update", DEMO_BITS="0x3f800001")
    assert "[moved] demo: 0 tokens differ, 1 logprobs differ in bits" in r.stdout
    assert child(DEMO_BITS="0x3f800001").returncode == 0


@pytest.mark.parametrize("force,rc", [(False, 4), (True, 0)])
def test_ci_refuses_update_unless_forced(child, pytester, force, rc):
    """Bug pinned: CI regenerating (and so blessing) the goldens it should check."""
    args = ["--golden-update"] + (["--golden-force"] if force else [])
    r = child(*args, CI="true")
    assert r.returncode == rc, r.stdout + r.stderr
    if not force:
        assert "CI is set" in r.stderr and not (pytester.path / "golden").exists()


TENSOR_TEST = """
import os
import torch

def test_kernel(golden):
    out = torch.linspace(0, 1, 8)
    bump = int(os.environ.get("DEMO_BUMP", "0"))
    out = out.view(torch.int32).add(bump).view(torch.float32)
    golden.check_tensors("toy", {"out": out, "idx": torch.arange(3)})
"""


@pytest.fixture
def tensor_child(pytester, monkeypatch):
    """Run pytest on a test file that golden-checks tensors."""
    pytester.makepyfile(test_toy=TENSOR_TEST)

    def run(*args: str, **env: str) -> SimpleNamespace:
        for k in ("CI", "DEMO_BUMP", "DETSAMPLE_GOLDEN_DIR"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        r = pytester.runpytest("-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args)
        return SimpleNamespace(returncode=int(r.ret), stdout=r.stdout.str() + r.stderr.str())

    return run


def test_check_tensors_fixture_cycle(tensor_child, pytester):
    """golden.check_tensors: skip without goldens, record, pass, fail on one ulp with
    the report, accept with --golden-update; goldens default to <rootdir>/golden."""
    r = tensor_child()
    assert "1 skipped" in r.stdout and "NO TENSOR GOLDENS" in r.stdout
    r = tensor_child("--golden-update")
    assert r.returncode == 0 and "[new] toy: new golden (2 tensors, 11 elements)" in r.stdout
    (toy,) = (pytester.path / "golden").glob("*/tensors/toy")
    assert tensor_child().returncode == 0
    r = tensor_child(DEMO_BUMP="1")
    assert r.returncode == 1
    assert "out: float32 [8]: 8 of 8 elements moved" in r.stdout and "1 ulp" in r.stdout
    assert (toy / "out.txt.obtained").is_file()
    r = tensor_child("--golden-update", DEMO_BUMP="1")
    assert "[moved] toy: 1 of 2 tensors differ" in r.stdout
    assert tensor_child(DEMO_BUMP="1").returncode == 0


def test_golden_isa_all_regenerates_every_cpu_folder(tensor_child, pytester):
    """--golden-isa all: one child session per ISA this CPU runs, each writing its own
    folder, its manifest saying native or emulated."""
    from detsample.golden import isa

    r = tensor_child("--golden-update", "--golden-isa", "all")
    assert r.returncode == 0, r.stdout
    for name in isa.supported_isas():
        (man,) = (pytester.path / "golden").glob(f"cpu-{name}-*/tensors/toy/manifest.json")
        mode = json.loads(man.read_text())["cpu_dispatch"]["mode"]
        assert mode == ("native" if name == isa.native_isa() else "emulated")
        assert f"ATEN_CPU_CAPABILITY={name}" in r.stdout
    assert "==> per ISA: " in r.stdout and "FAILED" not in r.stdout


def test_golden_isa_rejects_unsupported(tensor_child):
    r = tensor_child("--golden-isa", "avx9000")
    assert r.returncode == 4 and "isa must be 'all', 'current' or sets this CPU supports" in r.stdout
