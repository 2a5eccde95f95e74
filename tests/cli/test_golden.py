"""Tests of detsample/commands/golden.py: ``detsample golden verify|update|diff``."""

from __future__ import annotations

import pytest

from detsample.checks.faults import perturbed_sample
from detsample.cli import main
from detsample.golden.store import GoldenStore

ONE = ["-k", "random.greedy"]


def test_update_verify_diff_cycle(tmp_path, capsys, monkeypatch):
    """Bug pinned: update/verify disagreeing on the file contents."""
    monkeypatch.delenv("CI", raising=False)
    root = ["--golden-dir", str(tmp_path)]
    assert main(["golden", "verify", *ONE, *root]) == 1  # no goldens: not a pass
    assert "NOT a pass" in capsys.readouterr().err
    assert main(["golden", "update", *ONE, *root]) == 0
    assert "[new] random.greedy" in capsys.readouterr().out
    assert main(["golden", "verify", *ONE, *root]) == 0
    assert main(["golden", "diff", *ONE, *root]) == 0
    assert "no differences" in capsys.readouterr().out
    with perturbed_sample(rid="r1"):
        assert main(["golden", "diff", *ONE, *root]) == 1
        out = capsys.readouterr().out
        assert "--- golden/" in out and "+0x" in out and "r1@" in out
        assert main(["golden", "verify", *ONE, *root]) == 1
        assert "MISMATCH" in capsys.readouterr().out
        assert main(["golden", "update", *ONE, *root]) == 0
        assert "[moved]" in capsys.readouterr().out
        assert main(["golden", "verify", *ONE, *root]) == 0
    assert main(["golden", "verify", *ONE, *root]) == 1


def test_update_refused_under_ci(tmp_path, capsys, monkeypatch):
    """Bug pinned: CI silently rewriting the goldens it is meant to check."""
    monkeypatch.setenv("CI", "true")
    assert main(["golden", "update", *ONE, "--golden-dir", str(tmp_path)]) == 2
    assert "CI is set" in capsys.readouterr().err and not any(tmp_path.iterdir())
    assert main(["golden", "update", *ONE, "--golden-dir", str(tmp_path), "--force"]) == 0


def test_stale_and_prune(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    store = GoldenStore(tmp_path)
    (store.platform_dir / "gone.scenario").mkdir(parents=True)
    (store.platform_dir / "gone.scenario" / "manifest.json").write_text("{}")
    assert main(["golden", "update", *ONE, "--golden-dir", str(tmp_path)]) == 0
    assert "[stale] gone.scenario" in capsys.readouterr().out
    assert main(["golden", "update", *ONE, "--golden-dir", str(tmp_path), "--prune"]) == 0
    assert not (store.platform_dir / "gone.scenario").exists()


@pytest.mark.parametrize("argv", [["golden", "verify", "-k", "nope"], ["golden", "verify", "--device", "tpu"]])
def test_bad_arguments(argv, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("detsample golden verify: error: ")


def test_update_isa_all_writes_one_folder_that_every_set_verifies(tmp_path, capsys, monkeypatch):
    """--isa all: one subprocess per ISA this CPU supports; the first writes golden/cpu,
    the others verify it (a set that disagreed would fail, not overwrite it)."""
    import json

    from detsample.golden import isa

    monkeypatch.delenv("CI", raising=False)
    root = ["--golden-dir", str(tmp_path)]
    assert main(["golden", "update", "--isa", "all", *ONE, *root]) == 0
    out = capsys.readouterr().out
    sets = isa.supported_isas()
    assert [p.parent.parent.name for p in tmp_path.glob("*/*/manifest.json")] == ["cpu"]
    doc = json.loads(next(tmp_path.glob("cpu/random.greedy/manifest.json")).read_text())
    assert doc["platform_info"]["isa"] == sets[0]
    for i, name in enumerate(sets):
        assert f"ATEN_CPU_CAPABILITY={name}" in out
        assert (
            f"golden {'update' if i == 0 else 'verify'} " in out.split(f"ATEN_CPU_CAPABILITY={name}")[1].splitlines()[0]
        )
    assert "FAILED" not in out
    assert main(["golden", "verify", *ONE, *root]) == 0  # this process's ISA, in process


def test_isa_all_never_updates_twice(monkeypatch, capsys):
    """Pins the order of --isa all (without running it): update under the first set,
    verify under every other, with the update-only flags only on the update."""
    from detsample.golden import isa

    ran = []
    monkeypatch.setattr(isa, "supported_isas", lambda: ["default", "avx2", "avx512"])
    monkeypatch.setattr(isa, "run_under", lambda name, argv, echo, cwd=None: ran.append((name, list(argv))) or 0)
    monkeypatch.delenv("CI", raising=False)
    assert main(["golden", "update", "--isa", "all", "--force", *ONE]) == 0
    assert [n for n, _ in ran] == ["default", "avx2", "avx512"]
    assert [a[4] for _, a in ran] == ["update", "verify", "verify"]
    assert "--force" in ran[0][1] and all("--force" not in a for _, a in ran[1:])


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["golden", "diff", "--isa", "all"], "--isa applies to verify and update"),
        (["golden", "update", "--isa", "avx9000"], "sets this CPU supports"),
    ],
)
def test_isa_usage_errors(argv, msg, capsys):
    assert main([*argv, *ONE]) == 2
    assert msg in capsys.readouterr().err
