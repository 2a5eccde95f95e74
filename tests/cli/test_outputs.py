"""What the commands write (the output layer, detsample/outputs) and the silent passes that
came with it, each reproduction as the bug report gave it.

Bugs pinned: ``audit r.jsonl --json r.jsonl``, ``audit-log a.jsonl --json a.jsonl`` and
``rollout p.jsonl --prompts p.jsonl`` replaced their input by the output (exit 0); a
failure mid-write (``ulimit -f 16``) left a cut file where the old one was;
``rollout r.NPZ`` wrote ``r.NPZ.npz``; a closed or broken stdout was a traceback and exit 1
(which means "a gate failed"); a non-UTF-8 name on a strict UTF-8 stdout was a
UnicodeEncodeError; a factory's print corrupted ``--json -``; a model whose logits are NaN
rolled out with exit 0; audit-log rows that contradict each other passed the gates;
``--rollout-rs-threshold 1_2_3`` was lower 1, upper 23; ``--temperature 1e-320`` passed
parsing and failed every row; ``golden update`` below a file or into a symlink loop was
a raw OSError.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from detsample.cli import main
from tests.cli.test_bad_input import GOOD, LOG_ROW, factories, one_error_line  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


def _rollout_file(tmp_path, name="r.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(GOOD) + "\n")
    return path


def _log_file(tmp_path, **changes) -> Path:
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({**LOG_ROW, **changes}) + "\n")
    return path


def _cli(argv: list[str], cwd, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "detsample", *argv],
        cwd=cwd,
        env=env,
        capture_output=kw.pop("capture", True),
        timeout=120,
        **kw,
    )


# ------------------------------------------------------------------ outputs equal to inputs


def _same_input_cases(tmp_path):
    r = _rollout_file(tmp_path)
    a = _log_file(tmp_path)
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt_ids": [1, 2]}\n')
    os.link(r, tmp_path / "hard.jsonl")
    (tmp_path / "rep").mkdir()
    os.symlink(r, tmp_path / "rep" / "report.json")
    return [
        (["audit", str(r), "--json", str(r)], "audit", r, "--json", "FILE"),
        (["audit", str(r), "--json", str(tmp_path / "hard.jsonl")], "audit", r, "--json", "FILE"),
        (["audit", str(r), "--report", str(tmp_path / "rep")], "audit", r, "--report", "FILE"),
        (["audit-log", str(a), "--json", str(a)], "audit-log", a, "--json", "PATH"),
        (["rollout", str(p), "--prompts", str(p)], "rollout", p, "OUT", "--prompts"),
    ]


@pytest.mark.parametrize("case", range(5))
def test_an_output_that_is_an_input_is_refused_before_anything_is_read(tmp_path, capsys, case, monkeypatch):
    import detsample.audit.running.rollout as rollout

    monkeypatch.setattr(
        rollout, "generate_rollouts", lambda *a, **k: pytest.fail("the engine ran before OUT was checked")
    )
    argv, command, victim, out_flag, in_flag = _same_input_cases(tmp_path)[case]
    before = victim.read_bytes()
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err, command)
    assert out_flag in line and f"the input {in_flag} {victim}" in line, line
    assert victim.read_bytes() == before


# ------------------------------------------------------------------ files written whole


def test_rollout_writes_exactly_the_path_given(tmp_path, capsys):
    assert main(["rollout", str(tmp_path / "r.NPZ"), "--num-sequences", "1"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.NPZ"]
    assert main(["audit", str(tmp_path / "r.NPZ"), "--quiet"]) in (0, 1)  # readable NPZ
    assert "r.NPZ" in capsys.readouterr().out


def test_a_file_size_limit_leaves_the_old_rollout_and_no_partial_file(tmp_path):
    old = _rollout_file(tmp_path).read_bytes()
    proc = subprocess.run(
        ["bash", "-c", f"ulimit -f 16; exec {sys.executable} -m detsample rollout r.jsonl --num-sequences 64"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (tmp_path / "r.jsonl").read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]
    assert proc.returncode == 2, proc.stderr
    assert "detsample rollout: error: cannot write OUT r.jsonl: File too large" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("where", ["/dev/null/g", "loop/g"])
def test_golden_update_that_cannot_write_is_one_named_line(tmp_path, capsys, monkeypatch, where):
    from detsample.golden import registry

    monkeypatch.delenv("CI", raising=False)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    root = where if where.startswith("/") else str(tmp_path / where)
    rc = main(["golden", "update", "--golden-dir", root, "-k", registry.names(quick=True)[0]])
    line = one_error_line(capsys.readouterr().err, "golden update")
    assert rc == 2 and "cannot write the goldens under" in line, line


# ------------------------------------------------------------------ streams


def test_a_broken_pipe_keeps_the_exit_code_and_prints_no_traceback(tmp_path):
    r = _rollout_file(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| true`: the reader is gone before anything is written
    try:
        proc = _cli(
            ["audit", str(r), "--json", "-", "--max-abs-diff", "0"],
            tmp_path,
            capture=False,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr


def test_a_closed_stdout_keeps_the_exit_code(tmp_path):
    r = _rollout_file(tmp_path)
    proc = _cli(
        ["audit", str(r), "--json", "-", "--max-abs-diff", "0"],
        tmp_path,
        capture=False,
        stderr=subprocess.PIPE,
        text=True,
        pass_fds=(),
        preexec_fn=lambda: os.close(1),
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_non_utf8_name_on_a_strict_stdout(tmp_path, monkeypatch):
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8", errors="strict"))
    name = os.fsdecode(bytes(tmp_path) + b"/x\xff.jsonl")
    assert main(["rollout", name, "--num-sequences", "1"]) == 0
    sys.stdout.flush()
    assert b"x\\udcff.jsonl" in raw.getvalue()
    assert os.path.exists(name)


def test_a_factory_that_prints_never_reaches_json_on_stdout(tmp_path, capsys, factories):
    r = tmp_path / "r.jsonl"
    r.write_text(json.dumps({k: v for k, v in GOOD.items() if k != "trainer_logprobs"}) + "\n")
    rc = main(["audit", str(r), "--rescore", f"{factories}:noisy", "--json", "-", "--quiet"])
    out, err = capsys.readouterr()
    assert rc in (0, 1) and json.loads(out)["tokens"] == 2
    assert "loading weights" in err


def test_a_model_with_nan_logits_is_a_named_rollout_error(tmp_path, capsys, factories):
    out = tmp_path / "n.jsonl"
    rc = main(["rollout", str(out), "--model", f"{factories}:nan_logits", "--num-sequences", "1"])
    line = one_error_line(capsys.readouterr().err, "rollout")
    assert rc == 2 and "NaN" in line and "row 0 at position 0" in line, line
    assert not out.exists()


# ------------------------------------------------------------------ summaries and options


CONTRADICTIONS = [
    ({"sequences": 0, "tokens": 1000}, "sequences 0 but tokens 1000"),
    ({"exact_match_fraction": 1.0, "mismatch_fraction": 1.0, "max_abs_diff": 0.5}, "sum past 1"),
    ({"mismatch_fraction": 0.0, "max_abs_diff": 0.5}, "max_abs_diff 0.5 but mismatch_fraction"),
    (
        {
            "mismatch_fraction": 0.5,
            "exact_match_fraction": 0.5,
            "mean_abs_diff": 0.3,
            "max_abs_diff": 0.1,
            "abs_diff_p99": 0.1,
        },
        "mean_abs_diff 0.3 above max_abs_diff 0.1",
    ),
    ({"tokens": 0}, "tokens 0 but exact_match_fraction"),
]


@pytest.mark.parametrize("changes,says", CONTRADICTIONS)
def test_audit_log_rows_that_contradict_themselves_never_pass(tmp_path, capsys, changes, says):
    log = _log_file(tmp_path, **changes)
    rc = main(["audit-log", str(log), "--max-mismatch", "1", "--min-exact-match", "0", "--quiet"])
    line = one_error_line(capsys.readouterr().err, "audit-log")
    assert rc == 2 and says in line and "line 1" in line, line


def test_a_consistent_log_still_passes(tmp_path):
    assert main(["audit-log", str(_log_file(tmp_path)), "--max-abs-diff", "0", "--quiet"]) == 0


@pytest.mark.parametrize(
    "argv,says",
    [
        (["audit", "{r}", "--rollout-rs-threshold", "1_2_3"], "got '1_2_3'"),
        (["audit", "{r}", "--rollout-is-threshold", "2_0"], "'2_0'"),
        (["audit", "{r}", "--max-abs-diff", "1_0"], "'1_0'"),
    ],
)
def test_numbers_with_separators_are_refused(tmp_path, capsys, argv, says):
    r = _rollout_file(tmp_path)
    try:
        rc = main([a.format(r=r) for a in argv])
    except SystemExit as exc:  # argparse
        rc = exc.code
    assert rc == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["rollout", "{tmp}/t.jsonl", "--temperature", "1e-320"],
        ["audit", "{tmp}/r.jsonl", "--rescore", "refmodel", "--logprobs-mode", "processed", "--temperature", "1e-320"],
    ],
)
def test_a_temperature_that_fails_every_row_is_refused_at_parse_time(tmp_path, capsys, argv, monkeypatch):
    import detsample.audit.running.rollout as rollout

    monkeypatch.setattr(rollout, "generate_rollouts", lambda *a, **k: pytest.fail("the engine ran"))
    _rollout_file(tmp_path)
    with pytest.raises(SystemExit) as info:
        main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert "temperature must be representable in float32 (finite, non-zero), got 1e-320" in err


def test_a_factory_writing_to_fd_1_never_reaches_json_on_stdout(tmp_path):
    (tmp_path / "fdfactory.py").write_text(
        "import os\n"
        "def make():\n"
        "    os.write(1, b'loading weights (C code)\\n')\n"
        "    from detsample.models import load_model\n"
        "    return load_model('refmodel')\n"
    )
    r = tmp_path / "r.jsonl"
    r.write_text(json.dumps({k: v for k, v in GOOD.items() if k != "trainer_logprobs"}) + "\n")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    proc = subprocess.run(
        [sys.executable, "-m", "detsample", "audit", str(r), "--rescore", "fdfactory:make", "--json", "-", "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(proc.stdout)["tokens"] == 2, proc.stdout
    assert "loading weights (C code)" in proc.stderr


def test_check_json_among_the_goldens_is_refused_before_the_battery(tmp_path, capsys, monkeypatch):
    import detsample.checks.battery as battery

    monkeypatch.setattr(battery, "run_battery", lambda *a, **k: pytest.fail("the battery ran"))
    root = tmp_path / "g"
    (root / "cpu").mkdir(parents=True)
    out = root / "cpu" / "report.json"
    assert main(["check", "--quick", "--golden-dir", str(root), "--json", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err, "check")
    assert f"--json {out} is inside the input --golden-dir {root / 'cpu'}" in line, line


def test_a_report_that_cannot_be_written_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    import errno

    import detsample.outputs.files as files

    def full(fh, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "_put", full)
    rep = tmp_path / "rep"
    rc = main(["audit", str(_rollout_file(tmp_path)), "--report", str(rep), "--quiet"])
    line = one_error_line(capsys.readouterr().err, "audit")
    # the first file the report writes (an exact audit draws no plot: report.json)
    assert rc == 2 and line.endswith(f"cannot write --report {rep}/report.json: No space left on device"), line
    assert list(rep.iterdir()) == []  # no partial file
