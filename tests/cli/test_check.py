"""Tests of detsample/commands/check.py: ``detsample check`` exit status, table, JSON.

Each failure mode is provoked with a monkeypatched perturbation of the sampler and must
give exit 1 and a readable report naming the check that broke.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from detsample.checks import battery
from detsample.checks.faults import perturbed_compute_logprobs, perturbed_sample
from detsample.cli import main
from detsample.cli._progress import Progress
from detsample.probe.threads import torch_threads

ONE = ["-k", "random.temperature"]
CHECK = ONE


@pytest.fixture(autouse=True)
def no_external(monkeypatch):
    """Keep these tests to the synthetic battery (external checks have their own tests)."""
    monkeypatch.setattr(battery, "EXTERNAL_CHECK_MODULES", ())
    monkeypatch.setattr(battery.external_checks, "__defaults__", ((),))


def run_check(capsys, tmp_path, *extra):
    path = tmp_path / "report.json"
    rc = main(["check", *CHECK, "--json", str(path), *extra])
    out = capsys.readouterr().out
    return rc, out, json.loads(path.read_text())


def statuses(doc):
    return {c["name"]: c["ok"] for c in doc["checks"]}


def test_clean_run_passes(capsys, tmp_path):
    rc, out, doc = run_check(capsys, tmp_path)
    assert rc == 0 and doc["ok"] is True
    assert set(statuses(doc)) == set(battery.SCENARIO_CHECKS) and all(statuses(doc).values())
    assert "ALL CHECKS PASSED" in out and "CHECK" in out and "RESULT" in out
    assert doc["platform"] in out
    assert all(set(c) >= {"name", "ok", "detail"} for c in doc["checks"])
    # which folder it compared against, and how this run dispatches (native / emulated)
    assert doc["golden_dir"].endswith(doc["platform"])
    assert f"goldens compared against {doc['golden_dir']}" in out and "this run: cpu ISA" in out


# (perturbation when(batch), the checks that must fail). A perturbed sample() also
# disagrees with compute_logprobs, so alignment fails whenever the canonical run moved.
BREAKS = [
    ("golden bit", lambda b: True, "r0", {"golden", "logprob_alignment"}),
    ("batch composition", lambda b: len(b) > 1, None, {"golden", "batch_invariance", "logprob_alignment"}),
    ("thread count", lambda b: torch.get_num_threads() == 1, None, {"threads_1_vs_2"}),
]


@pytest.mark.parametrize("name,when,rid,broken", BREAKS, ids=[b[0] for b in BREAKS])
def test_perturbation_fails_with_report(capsys, tmp_path, name, when, rid, broken):
    """Bug pinned: a gate that exits 0 while a bit moved."""
    with perturbed_sample(when, rid), torch_threads(2):
        rc, out, doc = run_check(capsys, tmp_path)
    assert rc == 1 and doc["ok"] is False
    assert {k for k, ok in statuses(doc).items() if not ok} == broken
    assert "first divergence: request r0" in out and "FAIL" in out
    if "golden" in broken:
        assert "obtained files written" in out
    assert main(["golden", "verify", *ONE]) == 0  # a passing verify removes the .obtained


def test_alignment_break_fails(capsys, tmp_path):
    """Bug pinned: sampling-time logprob != the rescoring path's (the p_vs_d check)."""
    with perturbed_compute_logprobs():
        rc, out, doc = run_check(capsys, tmp_path)
    assert rc == 1
    assert {k for k, ok in statuses(doc).items() if not ok} == {"logprob_alignment"}
    assert "!= compute_logprobs" in out


def test_missing_goldens_fail_unless_allowed(capsys, tmp_path):
    """Bug pinned: a platform without goldens passing the gate."""
    rc, out, doc = run_check(capsys, tmp_path, "--golden-dir", str(tmp_path / "none"))
    assert rc == 1 and "SKIP" in out and "NOT a pass" in out
    golden = [c for c in doc["checks"] if c["name"] == "golden"][0]
    assert golden["ok"] is False and golden["skipped"] is True
    rc, out, doc = run_check(capsys, tmp_path, "--golden-dir", str(tmp_path / "none"), "--allow-missing-goldens")
    assert rc == 0 and "SKIP" in out


def test_unknown_device_is_usage_error(capsys):
    assert main(["check", "--device", "tpu"]) == 2


def test_edited_golden_file_fails_with_first_divergence(capsys, tmp_path):
    """Bug pinned: a golden whose bits were changed on disk still passing the gate."""
    import shutil

    from detsample.golden.store import GoldenStore

    real = GoldenStore()
    copy = GoldenStore(tmp_path / "g")
    shutil.copytree(real.scenario_dir(ONE[1]), copy.scenario_dir(ONE[1]))
    p = copy.scenario_dir(ONE[1]) / "logprobs.txt"
    lines = p.read_text().splitlines(True)
    hexbits, _, label = lines[5].split()
    bits = int(hexbits, 16) ^ 1
    from detsample.golden.format import float_text

    lines[5] = f"0x{bits:08x} {float_text(bits)} {label}\n"
    p.write_text("".join(lines))
    rc, out, doc = run_check(capsys, tmp_path, "--golden-dir", str(tmp_path / "g"))
    assert rc == 1 and not statuses(doc)["golden"]
    assert f"first divergence: request {label.split('@')[0]} position {label.split('@')[1]}" in out


def test_unknown_scenario_is_usage_error(capsys):
    """Bug pinned: `check -k typo` ran the whole battery and reported five FAILs with
    KeyError tracebacks (exit 1) instead of a usage error naming the scenario (exit 2)."""
    assert main(["check", "-k", "no.such"]) == 2
    err = capsys.readouterr().err
    assert "detsample check:" in err and "'no.such'" in err and "Traceback" not in err


def test_unwritable_json_exits_2(capsys, tmp_path):
    """Bug pinned: `--json` naming a directory crashed with a traceback after the whole
    battery ran (exit 1, indistinguishable from a failed check)."""
    assert main(["check", *CHECK, "--json", str(tmp_path)]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_unwritable_json_is_refused_before_the_battery(capsys, tmp_path, monkeypatch):
    """Bug pinned: the --json path was found unwritable only after the run."""
    import detsample.checks.battery as battery

    monkeypatch.setattr(battery, "run_battery", lambda *a, **k: pytest.fail("battery ran"))
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    assert main(["check", *ONE, "--json", str(blocker / "x.json")]) == 2
    assert f"{blocker} is not a directory" in capsys.readouterr().err


def test_top_logprob_kernel_swap_fails_check(capsys, tmp_path, monkeypatch):
    """Bug pinned: a kernel change that moves only the top-n logprobs passing the gate
    (goldens used to record only the sampled token's logprob). The log_softmax called
    while the Sampler computes top logprobs is swapped for log(softmax): no token and no
    sampled logprob moves, and only the golden check fails."""
    import detsample.ops.logprobs as lp_ops
    from detsample.sampler import Sampler

    monkeypatch.delenv("CI", raising=False)
    args = ["-k", "random.top_logprobs", "--golden-dir", str(tmp_path)]
    assert main(["golden", "update", *args]) == 0
    assert main(["check", *args]) == 0
    capsys.readouterr()
    real, real_top = lp_ops.log_softmax, Sampler._top_logprobs
    in_top = []

    def swapped(x, **kw):
        if kw.get("kept_mass") is None and kw.get("at") is None and in_top:
            return torch.log(torch.softmax(x, dim=-1))
        return real(x, **kw)

    def top_logprobs(self, *a, **kw):
        in_top.append(1)
        try:
            return real_top(self, *a, **kw)
        finally:
            in_top.pop()

    monkeypatch.setattr(lp_ops, "log_softmax", swapped)
    monkeypatch.setattr(Sampler, "_top_logprobs", top_logprobs)
    path = tmp_path / "report.json"
    assert main(["check", *args, "--json", str(path)]) == 1
    out = capsys.readouterr().out
    assert "random.top_logprobs: 0 tokens differ, 0 logprobs differ in bits" in out
    assert "top logprobs differ" in out and "first top-logprob divergence" in out
    assert {k for k, ok in statuses(json.loads(path.read_text())).items() if not ok} == {"golden"}


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


PROGRESS_MODES = [  # (stream is a terminal, CI set, progress drawn)
    (False, False, False),
    (True, False, True),
    (True, True, False),
]


@pytest.mark.parametrize("tty,ci,drawn", PROGRESS_MODES)
def test_progress_only_on_a_terminal(monkeypatch, tty, ci, drawn):
    """Bug pinned: with stderr redirected to a CI log, every progress tick was a line of
    its own (49 lines of bars). Off a terminal, or under CI, progress writes nothing; on
    one a rich bar ends at 5/5."""
    monkeypatch.delenv("CI", raising=False)
    if ci:
        monkeypatch.setenv("CI", "1")
    stream = _Stream(tty)
    bar = Progress("check", stream)
    for i in range(6):
        bar(i, 5, f"step {i}")
    bar.close()
    text = stream.getvalue()
    assert (text != "") == drawn
    if drawn:
        assert "5/5" in text and "step 5" in text


def test_check_output_off_a_terminal_has_no_progress_lines(capsys):
    rc = main(["check", *CHECK])
    cap = capsys.readouterr()
    assert rc == 0 and "ALL CHECKS PASSED" in cap.out
    assert "[#" not in cap.err + cap.out and "[." not in cap.err + cap.out


def _check(env_extra: dict, tmp_path=None) -> subprocess.CompletedProcess:
    """``detsample check --quick`` on one scenario in a subprocess, with ``env_extra``."""
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY",)}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "detsample", "check", "--quick", *ONE],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )


def test_every_instruction_set_compares_against_the_one_cpu_folder(tmp_path):
    """Bug pinned: goldens were kept per ATen instruction set (and re-run under MKL's
    SSE4.2 path), so a CPU without its set's folder failed or re-ran itself. The sampler's
    bits are detsample's own arithmetic now: under every set this CPU runs, the check
    compares against golden/cpu, in process, and passes."""
    from detsample.golden import isa

    for name in isa.supported_isas():
        proc = _check(
            {"ATEN_CPU_CAPABILITY": name, "MKL_ENABLE_INSTRUCTIONS": "AVX2" if name != "default" else "SSE4_2"},
            tmp_path,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "ALL CHECKS PASSED" in proc.stdout and "platform cpu " in proc.stdout
        assert "running under" not in proc.stdout and "re-run" not in proc.stdout


@pytest.mark.parametrize("version", ["2.13.0+cu130", "2.13.0", "2.14.1+cpu"])
def test_any_torch_build_uses_the_cpu_goldens(monkeypatch, version):
    """Bug pinned: with the package index's default torch (the CUDA build, reporting
    ``2.13.0+cu130``) `detsample check` exited 1 for want of a folder named after that
    build, though every bit equalled the goldens. The scenario goldens are keyed by
    nothing of the build: the store is ``cpu`` whatever torch reports (tensor goldens,
    a user's kernels, keep the full fingerprint)."""
    from detsample.golden.store import GoldenStore

    monkeypatch.setattr(torch, "__version__", version)
    store = GoldenStore()
    assert store.fingerprint == "cpu" and store.platform_dir.name == "cpu"
    assert store.tensor_fingerprint.endswith(f"torch{version}")
    assert main(["check", "--quick", *ONE]) == 0
