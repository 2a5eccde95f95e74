"""Tests of detsample/golden.py: the golden store (verify, atomic update, loud skip)."""

from __future__ import annotations

import os

import pytest

import detsample.golden.store as golden_mod
from detsample.golden.format import FILES, LOGPROBS, TOKENS
from detsample.golden.store import (
    CORRUPT,
    MISMATCH,
    MISSING_PLATFORM,
    MISSING_SCENARIO,
    OK,
    ChangeKind,
    GoldenStore,
    golden_root,
)
from tests.golden_helpers import (
    another_machine,
    git_commit_all,
    git_status,
    interrupt_staging_at,
    make,
    snapshot,
    with_top,
)

FP = "cpu-test-torch0"


def store(tmp_path) -> GoldenStore:
    return GoldenStore(tmp_path, fingerprint=FP)


def test_missing_platform_is_loud_skip_not_pass(tmp_path):
    """Bug pinned: a platform without goldens silently passing."""
    v = store(tmp_path).verify("a", make([1]))
    assert v.status == MISSING_PLATFORM and not v.ok and v.skipped
    assert "NOT a pass" in v.message and "--golden-update" in v.message and FP in v.message


def test_update_then_verify(tmp_path):
    s = store(tmp_path)
    changes = s.update({"a": make([1, 2]), "b": make([3])})
    assert [(c.scenario, c.kind) for c in changes] == [("a", "new"), ("b", "new")]
    assert s.verify("a", make([1, 2])).status == OK
    assert s.verify("zzz", make([1])).status == MISSING_SCENARIO
    assert s.scenarios() == ["a", "b"] and s.stale(["a"]) == ["b"]
    for f in FILES:
        assert (s.scenario_dir("a") / f).stat().st_mode & 0o644 == 0o644


def test_regenerate_twice_byte_identical(tmp_path):
    """Bug pinned: timestamps or dict order making every regeneration a diff."""
    s = store(tmp_path)
    s.update({"a": make([1, 0x80000000])})
    first = snapshot(tmp_path)
    changes = s.update({"a": make([1, 0x80000000])})
    assert snapshot(tmp_path) == first
    assert changes[0].kind == "unchanged"


def test_mismatch_writes_obtained_and_reports(tmp_path):
    s = store(tmp_path)
    s.update({"a": make([0x3F800000, 0x00000000])})
    v = s.verify("a", make([0x3F800000, 0x80000000]))
    assert v.status == MISMATCH and not v.ok
    assert "first divergence: request r1 position 4" in v.message
    d = s.scenario_dir("a")
    assert (d / (LOGPROBS + ".obtained")).read_text().splitlines()[1].startswith("0x80000000 -0.0")
    # the golden itself is untouched, and a later passing run removes the .obtained files
    assert (d / LOGPROBS).read_text().splitlines()[1].startswith("0x00000000 0.0")
    assert s.verify("a", make([0x3F800000, 0x00000000])).status == OK
    assert not list(d.glob("*.obtained"))


def test_update_reports_what_moved(tmp_path):
    s = store(tmp_path)
    s.update({"a": make([0x3F800000, 1])})
    (c,) = s.update({"a": make([0x3F800001, 1])})
    assert c.kind == "moved" and "1 logprobs differ in bits" in c.report and "1 ulp" in c.report


CHANGE_KINDS = [  # (old output, new output, kind)
    (None, make([1]), ChangeKind.NEW),
    (make([1]), make([2]), ChangeKind.MOVED),
    (make([1], meta={"note": "a"}), make([1], meta={"note": "b"}), ChangeKind.METADATA),
    (make([1]), make([1]), ChangeKind.UNCHANGED),
]


@pytest.mark.parametrize("old,new,kind", CHANGE_KINDS)
def test_update_change_kinds(tmp_path, old, new, kind):
    """Bug pinned: ``Change.kind`` was a bare string with an undocumented "metadata"
    value; it is a :class:`ChangeKind`, and reports print its value."""
    s = store(tmp_path)
    if old is not None:
        s.update({"a": old})
    (c,) = s.update({"a": new})
    assert c.kind is kind and f"[{c.kind}]" == f"[{kind.value}]"


def test_an_update_on_another_machine_with_the_same_bits_rewrites_nothing(tmp_path, monkeypatch):
    """Bug pinned: ``--golden-update`` on a machine other than the goldens' producer
    rewrote every manifest (its ISA, MKL level and library version) although no bit
    changed, so a kernel developer's change carried dozens of files of noise. Now
    ``git diff`` stays empty; a golden whose bits move records the new machine."""
    s = store(tmp_path)
    s.update({"a": make([1, 2]), "b": with_top(make([3]), [1])})
    git_commit_all(tmp_path)
    another_machine(monkeypatch)
    changes = s.update({"a": make([1, 2]), "b": with_top(make([3]), [1])})
    assert [c.kind for c in changes] == [ChangeKind.UNCHANGED] * 2
    assert "provenance" in changes[0].report
    assert git_status(tmp_path) == ""
    (c,) = s.update({"a": make([1, 5])})
    assert c.kind is ChangeKind.MOVED
    assert '"library_version": "9.9.9"' in (s.scenario_dir("a") / "manifest.json").read_text()


def test_corrupt_golden_reported(tmp_path):
    s = store(tmp_path)
    s.update({"a": make([5, 6])})
    p = s.scenario_dir("a") / TOKENS
    p.write_text(p.read_text().replace("7 r1@4", "8 r1@4"))
    v = s.verify("a", make([5, 6]))
    assert v.status == CORRUPT and "sha256" in v.message


def test_interrupted_staging_leaves_old_files(tmp_path, monkeypatch):
    """Bug pinned: an interrupted --golden-update leaving half-written goldens."""
    s = store(tmp_path)
    s.update({"a": make([1]), "b": make([2])})
    before = snapshot(tmp_path)
    interrupt_staging_at(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        s.update({"a": make([10]), "b": make([20])})
    assert snapshot(tmp_path) == before  # no temp files left, old bytes intact


def test_interrupted_rename_leaves_whole_files(tmp_path, monkeypatch):
    """Each file is either wholly old or wholly new; no temporary files remain."""
    s = store(tmp_path)
    s.update({"a": make([1])})
    before = snapshot(tmp_path)
    real, calls = os.replace, []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(golden_mod.os, "replace", flaky)
    with pytest.raises(OSError):
        s.update({"a": make([9])})
    after = snapshot(tmp_path)
    assert set(after) == set(before)
    new = store(tmp_path / "fresh")
    new.update({"a": make([9])})
    fresh = snapshot(tmp_path / "fresh")
    for k, v in after.items():
        assert v in (before[k], fresh.get(k)), k


def test_golden_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("DETSAMPLE_GOLDEN_DIR", str(tmp_path))
    assert golden_root() == tmp_path
    monkeypatch.delenv("DETSAMPLE_GOLDEN_DIR")
    assert golden_root().name == "golden"


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden"])
def test_bad_scenario_name(tmp_path, name):
    with pytest.raises(ValueError, match="scenario name"):
        store(tmp_path).scenario_dir(name)


def test_verify_all_and_update_all(tmp_path, monkeypatch):
    """The scenario-level entry points: refused under CI, then new, then all ok."""
    from detsample.golden.store import GoldenUpdateRefused, update_all, verify_all

    monkeypatch.setenv("CI", "1")
    with pytest.raises(GoldenUpdateRefused, match="CI is set"):
        update_all(["random.greedy"], root=tmp_path)
    assert [v.status for v in verify_all(["random.greedy"], root=tmp_path)] == [MISSING_PLATFORM]
    assert [c.kind for c in update_all(["random.greedy"], root=tmp_path, force=True)] == ["new"]
    assert [v.status for v in verify_all(["random.greedy"], root=tmp_path)] == [OK]


def test_hand_edited_golden_is_corrupt_and_still_compared(tmp_path):
    """Bug pinned: a hand-edited golden reported only as "corrupt" without saying where
    the obtained output differs from it."""
    s = store(tmp_path)
    s.update({"a": make([0x3F800000, 0x3F000000])})
    p = s.scenario_dir("a") / LOGPROBS
    p.write_text(p.read_text().replace("0x3f000000 0.5", "0x3f000001 0.50000006"))
    v = s.verify("a", make([0x3F800000, 0x3F000000]))
    assert v.status == CORRUPT and not v.ok
    assert "sha256" in v.message and "first divergence: request r1 position 4" in v.message
    assert (s.scenario_dir("a") / (LOGPROBS + ".obtained")).is_file()


def test_mismatch_notes_changed_inputs(tmp_path):
    """Bug pinned: a golden moved by a changed input generator blamed on the sampler."""
    s = store(tmp_path)
    s.update({"a": make([1, 2], meta={"inputs": {"logits_sha256": ["aa"]}, "rng": "x"})})
    v = s.verify("a", make([1, 3], meta={"inputs": {"logits_sha256": ["bb"]}, "rng": "x"}))
    assert v.status == MISMATCH and "note: the scenario's 'inputs' differ" in v.message
    assert "'rng'" not in v.message
    v = s.verify("a", make([1, 3], meta={"inputs": {"logits_sha256": ["aa"]}, "rng": "x"}))
    assert "note:" not in v.message


def test_top_logprobs_file_follows_the_output(tmp_path):
    """top_logprobs.txt is written when an entry has top logprobs, compared, and removed
    when none has any more (no stale file contradicting the manifest)."""
    from detsample.golden.format import TOP_LOGPROBS
    from tests.golden_helpers import with_top

    s = store(tmp_path)
    s.update({"a": with_top(make([1, 2]), [2, 0])})
    assert (s.scenario_dir("a") / TOP_LOGPROBS).is_file()
    assert s.verify("a", with_top(make([1, 2]), [2, 0])).status == OK
    v = s.verify("a", with_top(make([1, 2]), [2, 0], bits=[0xBF800000, 0xBF800003]))
    assert v.status == MISMATCH and "1 top logprobs differ" in v.message
    assert (s.scenario_dir("a") / (TOP_LOGPROBS + ".obtained")).is_file()
    assert s.update({"a": with_top(make([1, 2]), [2, 0])})[0].kind == "unchanged"
    assert s.update({"a": make([1, 2])})[0].kind == "moved"
    assert not (s.scenario_dir("a") / TOP_LOGPROBS).exists()
    assert s.verify("a", make([1, 2])).status == OK and not list(s.scenario_dir("a").glob("*.obtained"))
