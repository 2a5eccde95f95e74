"""Tests of detsample/golden/tensor_store.py: tensor goldens of one platform and the
script API ``detsample.golden.check_tensors``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detsample.errors import GoldenMismatch
from detsample.golden import check_tensors
from detsample.golden.store import (
    CORRUPT,
    MISMATCH,
    MISSING_PLATFORM,
    MISSING_SCENARIO,
    OK,
    GoldenMissing,
    GoldenStore,
    GoldenUpdateRefused,
)
from detsample.golden.tensor_store import TensorGoldens, device_of
from tests.golden_helpers import another_machine, git_commit_all, git_status, interrupt_staging_at, snapshot

FP = "cpu-test-torch0"


def goldens(tmp_path) -> TensorGoldens:
    return TensorGoldens(GoldenStore(tmp_path, fingerprint=FP))


def kernel(bump: int = 0) -> dict:
    x = torch.linspace(-2, 2, 24, dtype=torch.float32).reshape(4, 6)
    out = torch.softmax(x, dim=-1)
    if bump:
        out = out.view(torch.int32).add(bump).view(torch.float32)
    return {"x": x, "out": out, "argmax": out.argmax(-1), "big": torch.arange(2000.0)}


def test_missing_platform_is_loud_skip(tmp_path):
    """Bug pinned: a fresh machine reporting green for tensor goldens it never had."""
    v = goldens(tmp_path).verify("k", kernel())
    assert v.status == MISSING_PLATFORM and v.skipped and not v.ok
    assert "NOT a pass" in v.message and "--golden-update" in v.message


def test_update_verify_mismatch_cycle(tmp_path):
    g = goldens(tmp_path)
    assert g.update("k", kernel()).kind == "new"
    d = g.golden_dir("k")
    assert sorted(p.name for p in d.iterdir()) == ["argmax.txt", "big.bin", "manifest.json", "out.txt", "x.txt"]
    assert g.verify("k", kernel()).status == OK
    assert g.verify("other", kernel()).status == MISSING_SCENARIO
    v = g.verify("k", kernel(bump=1))
    assert v.status == MISMATCH
    assert "out: float32 [4, 6]: 24 of 24 elements moved" in v.message
    assert "ULP histogram (float32 ULPs): 1: 24" in v.message
    assert (d / "out.txt.obtained").is_file() and (d / "manifest.json.obtained").is_file()
    golden_out = (d / "out.txt").read_text()
    assert g.verify("k", kernel()).status == OK
    assert not list(d.glob("*.obtained")) and (d / "out.txt").read_text() == golden_out


def test_regenerate_twice_byte_identical(tmp_path):
    g = goldens(tmp_path)
    g.update("k", kernel())
    first = snapshot(tmp_path)
    assert g.update("k", kernel()).kind == "unchanged"
    assert snapshot(tmp_path) == first


def test_an_update_on_another_machine_with_the_same_bits_rewrites_nothing(tmp_path, monkeypatch):
    """Bug pinned: an update on another machine rewrote a tensor golden's manifest (the
    producer's ISA, MKL level, library version) although no bit changed."""
    g = goldens(tmp_path)
    g.update("k", kernel())
    git_commit_all(tmp_path)
    another_machine(monkeypatch)
    assert g.update("k", kernel()).kind == "unchanged"
    assert git_status(tmp_path) == ""
    assert g.update("k", kernel(bump=1)).kind == "moved"
    assert git_status(tmp_path) != ""


def test_update_reports_moved_and_drops_old_files(tmp_path):
    g = goldens(tmp_path)
    g.update("k", kernel())
    c = g.update("k", {**kernel(bump=1), "big": torch.arange(10.0)})
    assert c.kind == "moved" and "out: float32 [4, 6]: 24 of 24 elements moved" in c.report
    names = sorted(p.name for p in g.golden_dir("k").iterdir())
    assert "big.bin" not in names and "big.txt" in names  # 10 elements: now text
    assert g.verify("k", {**kernel(bump=1), "big": torch.arange(10.0)}).ok


def test_corrupt_golden_still_compared(tmp_path):
    """Bug pinned: a hand-edited golden reported as corrupt without what moved."""
    g = goldens(tmp_path)
    g.update("k", kernel())
    p = g.golden_dir("k") / "argmax.txt"
    p.write_text(p.read_text().replace("0x0000000000000005 5", "0x0000000000000004 4", 1))
    v = g.verify("k", kernel())
    assert v.status == CORRUPT and "sha256" in v.message
    assert "argmax: int64 [4]: 1 of 4 elements moved" in v.message
    (g.golden_dir("k") / "big.bin").write_bytes(b"\0" * 7)
    v = g.verify("k", kernel())
    assert v.status == CORRUPT and "7 bytes" in v.message


def test_interrupted_update_leaves_old_files(tmp_path, monkeypatch):
    """Bug pinned: an interrupted update leaving a half-written tensor golden."""
    g = goldens(tmp_path)
    g.update("k", kernel())
    before = snapshot(tmp_path)
    interrupt_staging_at(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        g.update("k", kernel(bump=1))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden"])
def test_bad_golden_name(tmp_path, name):
    with pytest.raises(ValueError, match="golden name must match"):
        goldens(tmp_path).update(name, kernel())


def test_script_api(tmp_path, monkeypatch):
    """check_tensors: golden/ in the current directory, raises on a miss and a move,
    DETSAMPLE_GOLDEN_UPDATE=1 records, CI refuses."""
    monkeypatch.chdir(tmp_path)
    for var in ("CI", "DETSAMPLE_GOLDEN_DIR", "DETSAMPLE_GOLDEN_UPDATE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(GoldenMissing, match="NO TENSOR GOLDENS"):
        check_tensors("k", kernel())
    monkeypatch.setenv("DETSAMPLE_GOLDEN_UPDATE", "1")
    assert check_tensors("k", kernel()).kind == "new"
    monkeypatch.delenv("DETSAMPLE_GOLDEN_UPDATE")
    assert list((tmp_path / "golden").glob("*/tensors/k/manifest.json"))
    assert check_tensors("k", kernel()).status == OK
    with pytest.raises(GoldenMismatch, match="1 ulp") as e:
        check_tensors("k", kernel(bump=1))
    assert isinstance(e.value, AssertionError)
    with pytest.raises(GoldenMissing, match="no tensor golden 'other'"):
        check_tensors("other", kernel())
    monkeypatch.setenv("CI", "true")
    with pytest.raises(GoldenUpdateRefused, match="CI is set"):
        check_tensors("k", kernel(bump=1), update=True)
    assert check_tensors("k", kernel(bump=1), update=True, force=True).kind == "moved"


def test_device_of():
    assert device_of({"a": np.zeros(1), "b": torch.zeros(1)}) == "cpu"
