"""Fuzzing the other commands: ``check``, ``golden``, ``probe`` and ``bench`` under
malformed options (test_fuzz_cli.py covers ``audit``, ``audit-log`` and ``rollout`` and
states the promises), and every command under a hostile environment for its output
streams (a stdout whose reader is gone, a closed stdout).

The promises are test_fuzz_cli's: an exit code in {0, 1, 2}, 1 only for a gate (``check``,
``golden verify`` / ``diff``, ``probe``); no traceback; exit 2 with one ``detsample
COMMAND: error:`` line; the inputs (the committed goldens, the audit's files) unchanged.
``check`` runs one golden scenario (``-k``) and, here, none of its model-level external
checks (``battery.external_checks``: 2.5 minutes of models that do not read an option
fuzzed here). Bounded like test_fuzz_cli (``DETSAMPLE_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from detsample.checks import battery
from tests.cli.test_fuzz_cli import FUZZ_SETTINGS, NUMBERS, PATH_VALUES, PATHS, _ends_as_promised, _files, draw_command

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = "ties.top_k"
#: golden folders: the committed one (an input: never written by verify, diff or check),
#: a copy the test may let ``golden update`` write, and the fuzzed paths
GOLDEN_DIRS = st.sampled_from(["{goldens}", "{scratch}", *PATH_VALUES])
DEVICES = st.sampled_from(["cpu", "cuda", "tpu", "", "cpu:0", "meta"])
LISTS = st.sampled_from(["1", "1,2", "0", "-1", "1,,2", "abc", "", "99999999999", "1.5", "2_3"])

#: command -> (its fixed arguments, its options and their value strategies)
COMMANDS = {
    "check": (
        ["-k", SCENARIO],
        {
            "--json": PATHS,
            "--golden-dir": GOLDEN_DIRS,
            "--device": DEVICES,
            "-k": st.sampled_from([SCENARIO, "no.such", ""]),
        },
    ),
    "golden verify": (
        ["-k", SCENARIO],
        {
            "--golden-dir": GOLDEN_DIRS,
            "--device": DEVICES,
            "--isa": st.sampled_from(["avx2", "avx512", "default", "sse9", "", "all"]),
        },
    ),
    "golden diff": (["-k", SCENARIO], {"--golden-dir": GOLDEN_DIRS, "--device": DEVICES}),
    "golden update": (
        ["-k", SCENARIO, "--golden-dir", "{scratch}"],
        {"--golden-dir": GOLDEN_DIRS, "--isa": st.sampled_from(["default", "x", ""])},
    ),
    "probe ops": (
        ["--op", "softmax", "--threads", "1"],
        {
            "--threads": LISTS,
            "--dtype": st.sampled_from(["float32", "bfloat16", "int8", ""]),
            "--op": st.sampled_from(["softmax", "no_such_op", ""]),
            "--json": PATHS,
            "--device": DEVICES,
        },
    ),
    "bench": (
        ["--config", "greedy", "--batch", "1", "--vocab", "64", "--repeat", "1", "--min-seconds", "0", "--no-compile"],
        {
            "--batch": LISTS,
            "--vocab": LISTS,
            "--repeat": NUMBERS,
            "--min-seconds": NUMBERS,
            "--threads": NUMBERS,
            "--json": PATHS,
            "--config": st.sampled_from(["greedy", "nope", ""]),
            "--stat": st.sampled_from(["median", "min", "max"]),
        },
    ),
}
GATES = {"check", "golden verify", "golden diff", "probe ops"}


@pytest.fixture
def files(tmp_path):
    import shutil

    out = _files(tmp_path)
    out["goldens"] = str(ROOT / "golden")
    scratch = tmp_path / "scratch"
    shutil.copytree(ROOT / "golden", scratch)
    out["scratch"] = str(scratch)
    return out


def _golden_inputs(files: dict[str, str]) -> list[str]:
    return [str(p) for p in sorted(Path(files["goldens"]).rglob("*")) if p.is_file()]


@st.composite
def invocations(draw):
    command, argv, chosen, options = draw_command(draw, COMMANDS)
    for opt in chosen:
        argv += [opt, draw(options[opt])]
    return command, argv


def _run(command: str, argv: list[str], files: dict[str, str], capsys) -> None:
    """``argv`` against the promises; the committed goldens are every command's input
    here (read by check, verify and diff; never the folder update writes)."""
    _ends_as_promised(argv, files, capsys, inputs=_golden_inputs(files), gate=command in GATES)


@FUZZ_SETTINGS
@given(inv=invocations())
def test_malformed_options_of_every_command_end_as_promised(files, capsys, monkeypatch, inv):
    monkeypatch.setattr(battery, "external_checks", lambda: [])
    monkeypatch.delenv("CI", raising=False)  # golden update runs (into scratch copies only)
    monkeypatch.chdir(files["dir"])  # a relative output ("-" as a folder) lands in tmp
    command, argv = inv
    if command == "golden update" and argv.count("--golden-dir") > 1:
        i = len(argv) - 1 - argv[::-1].index("--golden-dir")  # the fuzzed one wins
        if argv[i + 1] == "{goldens}":
            argv[i + 1] = "{scratch}"  # never regenerate the committed goldens here
    _run(command, argv, files, capsys)


def test_the_harness_catches_a_traceback(files, capsys, monkeypatch):
    """Negative control: an error that escapes a command as an exception (as the old
    ``golden update`` below /dev/null did) fails the harness."""
    from detsample.golden import store

    def boom(*a, **k):
        raise TypeError("unhandled")

    monkeypatch.setattr(store.GoldenStore, "update", boom)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises((AssertionError, TypeError)):
        _run("golden update", ["golden", "update", "-k", SCENARIO, "--golden-dir", "{scratch}"], files, capsys)


#: (command line, exit code with a working stdout): a cheap run of every command that
#: prints to stdout
STREAMED = [
    (["golden", "verify", "-k", SCENARIO], 0),
    (["probe", "ops", "--op", "softmax", "--threads", "1", "--json", "-"], 0),
    (
        [
            "bench",
            "--config",
            "greedy",
            "--batch",
            "1",
            "--vocab",
            "64",
            "--repeat",
            "1",
            "--min-seconds",
            "0",
            "--no-compile",
            "--json",
            "-",
        ],
        0,
    ),
    (["rollout", "{tmp}/r.jsonl", "--num-sequences", "1", "--max-new-tokens", "2"], 0),
    (["audit", "{tmp}/missing.jsonl"], 2),
]


@pytest.mark.parametrize("stream", ["reader gone", "closed"])
@pytest.mark.parametrize("argv,code", STREAMED, ids=[" ".join(a[:2]) for a, _ in STREAMED])
def test_a_hostile_stdout_keeps_every_commands_exit_code(tmp_path, argv, code, stream):
    """``cmd | true`` (the reader gone before anything is written) and a closed fd 1: the
    command's own exit code, no traceback, nothing "ignored" at exit."""
    argv = [a.format(tmp=tmp_path) for a in argv]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "detsample", *argv]
    if stream == "closed":
        proc = subprocess.run(
            cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1), timeout=300
        )
    else:
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            proc = subprocess.run(
                cmd, cwd=tmp_path, env=env, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300
            )
        finally:
            os.close(write_end)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
