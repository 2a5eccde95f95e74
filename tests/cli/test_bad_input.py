"""Bad input never reaches a traceback, a hang, a crash or a silent pass, whatever the
command (detsample/cli/__init__.py's exit codes, the input layer detsample/inputs).

Bugs pinned: a FIFO given to ``audit`` (.jsonl, .pt, .npz, .parquet) or ``audit-log``
blocked for ever; a model factory calling ``sys.exit(0)`` made ``audit --rescore`` exit 0
having audited nothing and ``rollout`` exit 0 writing no file; a factory raising
``KeyboardInterrupt`` printed a traceback; Ctrl-C printed a traceback; ``--json
/dev/full`` said "No space left on device" without the path, and ``check`` printed ALL
CHECKS PASSED before failing to write it; ``bench --threads 100000`` and ``probe ops
--threads 1,100000`` crashed (exit 139); ``bench --vocab 100000000000`` allocated for ever;
``rollout --seed 2**63-1 --num-sequences 3`` named 2**63, a value nobody typed; ``probe
model`` on a model whose logits are all NaN raised from ``torch.multinomial``;
``ATEN_CPU_CAPABILITY=avx512`` on an AVX2 CPU died on an illegal instruction, no output.

Every case: exit 2 with one ``detsample COMMAND: error:`` line naming the file or option
and the value (or exit 1 for a failed gate, 130 for Ctrl-C), within a bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from detsample.cli import main
from tests.helpers import run_bounded

GOOD = {
    "id": "a",
    "prompt_ids": [1, 2],
    "response_ids": [3, 4],
    "engine_logprobs": [-0.5, -0.25],
    "trainer_logprobs": [-0.5, -0.25],
    "mask": [1, 1],
}
LOG_ROW = {
    "step": 0,
    "sequences": 1,
    "excluded_sequences": 0,
    "tokens": 2,
    "exact_match_fraction": 1.0,
    "mismatch_fraction": 0.0,
    "mean_abs_diff": 0.0,
    "max_abs_diff": 0.0,
    "k3_kl_mean": 0.0,
    "abs_diff_p99": 0.0,
    "ratio": {"mean": 1.0, "min": 1.0, "max": 1.0, "p50": 1.0},
}


def one_error_line(err: str, command: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("usage:") and not ln.startswith(" ")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"detsample {command}: error: "), err
    return lines[0]


# --------------------------------------------------------------------------- special files


def _fifo(path):
    os.mkfifo(path)
    return "a FIFO (named pipe)"


def _null_link(path):  # a device that ends at once: a broken reader passes silently here
    os.symlink("/dev/null", path)
    return "a character device (a symlink to /dev/null)"


def _directory(path):
    os.mkdir(path)
    return "a directory"


SPECIAL = {"fifo": _fifo, "device": _null_link, "directory": _directory}
COMMANDS = [["audit", "{}", "--quiet", "--max-abs-diff", "0"]] * 4 + [["audit-log", "{}"]]
NAMES = ["in.jsonl", "in.pt", "in.npz", "in.parquet", "log.jsonl"]


@pytest.mark.parametrize("special", sorted(SPECIAL))
@pytest.mark.parametrize("argv,name", list(zip(COMMANDS, NAMES)), ids=NAMES)
def test_special_files_are_named_and_refused(tmp_path, capsys, special, argv, name):
    path = str(tmp_path / name)
    kind = SPECIAL[special](path)
    rc = run_bounded([a.format(path) for a in argv], [path] if special == "fifo" else [])
    line = one_error_line(capsys.readouterr().err, argv[0])
    assert rc == 2 and path in line and kind in line, line


@pytest.mark.parametrize("special", sorted(SPECIAL))
def test_special_prompt_files_are_named_and_refused(tmp_path, capsys, special):
    """The bug: ``rollout --prompts`` a FIFO blocked for ever and /dev/zero was read until
    memory ran out (the prompts bypassed the input layer)."""
    path = str(tmp_path / "prompts.jsonl")
    kind = SPECIAL[special](path)
    rc = run_bounded(["rollout", str(tmp_path / "out.jsonl"), "--prompts", path], [path] if special == "fifo" else [])
    line = one_error_line(capsys.readouterr().err, "rollout")
    assert rc == 2 and path in line and kind in line, line
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(
    "content,says",
    [
        (b'{"prompt_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", ":1: JSON nested too deeply"),
        (b'{"prompt_ids": [1, 2]}\n\xff\xfe\n', ":2: not UTF-8 text (byte 0)"),
    ],
    ids=["deep-json", "not-utf8"],
)
def test_malformed_prompt_lines_are_named_by_line(tmp_path, capsys, content, says):
    """The bug: 100,000 nested brackets in a prompts file raised a RecursionError."""
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(content)
    rc = main(["rollout", str(tmp_path / "out.jsonl"), "--prompts", str(path)])
    line = one_error_line(capsys.readouterr().err, "rollout")
    assert rc == 2 and f"{path}{says}" in line, line


def test_a_tokenizer_that_cannot_encode_a_prompt_is_named(tmp_path, capsys):
    """The bug: a WordLevel tokenizer without an unknown token raised the tokenizers
    library's bare Exception (a traceback) on a word outside its vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"hello": 0, "world": 1}))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello world"}\n{"prompt": "hello there"}\n')
    rc = main(
        [
            "rollout",
            str(tmp_path / "out.jsonl"),
            "--prompts",
            str(prompts),
            "--tokenizer",
            str(tmp_path / "tokenizer.json"),
        ]
    )
    line = one_error_line(capsys.readouterr().err, "rollout")
    assert rc == 2 and f"{prompts}:2: the tokenizer" in line and "'hello there'" in line, line


# --------------------------------------------------------------------------- user code


FACTORIES = textwrap.dedent("""
    import os, signal, sys

    def exits_0():
        sys.exit(0)

    def exits_3():
        sys.exit(3)

    def interrupts():
        raise KeyboardInterrupt

    def noisy():  # prints, then returns a model (tests/cli/test_outputs.py)
        print("loading weights")
        from detsample.models import load_model
        return load_model("refmodel")

    def ctrl_c():  # a real Ctrl-C while the factory runs
        os.kill(os.getpid(), signal.SIGINT)
        import time
        time.sleep(5)

    def nan_logits():
        import torch
        from detsample.models.tiny import build_tiny
        m = build_tiny("hf-tiny-llama")
        with torch.no_grad():
            m.lm_head.weight.fill_(float("nan"))
        return m
""")


@pytest.fixture
def factories(tmp_path, monkeypatch):
    mod = f"userfactories_{os.getpid()}"
    (tmp_path / f"{mod}.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield mod
    sys.modules.pop(mod, None)


def _untrained(tmp_path):
    path = tmp_path / "r.jsonl"
    rec = {k: v for k, v in GOOD.items() if k != "trainer_logprobs"}
    path.write_text(json.dumps(rec) + "\n")
    return str(path)


USER_CODE = [
    ("exits_0", "called sys.exit(0)"),
    ("exits_3", "called sys.exit(3)"),
    ("interrupts", "raised KeyboardInterrupt"),
]


@pytest.mark.parametrize("factory,says", USER_CODE)
@pytest.mark.parametrize("command", ["audit", "rollout"])
def test_a_factory_that_exits_or_interrupts_is_a_named_error(tmp_path, capsys, factories, factory, says, command):
    spec = f"{factories}:{factory}"
    out = tmp_path / "out.jsonl"
    argv = (
        ["audit", _untrained(tmp_path), "--rescore", spec, "--max-abs-diff", "0", "--quiet"]
        if command == "audit"
        else ["rollout", str(out), "--model", spec, "--num-sequences", "1"]
    )
    rc = run_bounded(argv)
    line = one_error_line(capsys.readouterr().err, command)
    assert rc == 2 and spec in line and says in line, line
    assert not out.exists()


def test_ctrl_c_is_one_line_and_exit_130(tmp_path, capsys, factories):
    rc = main(["audit", _untrained(tmp_path), "--rescore", f"{factories}:ctrl_c", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 130 and err == "detsample audit: interrupted (Ctrl-C)\n", err


def test_a_model_with_nan_logits_is_named_by_probe_model(capsys, factories):
    rc = main(["probe", "model", f"{factories}:nan_logits"])
    line = one_error_line(capsys.readouterr().err, "probe")
    assert rc == 2 and "logits are not a distribution" in line and "NaN" in line, line


# --------------------------------------------------------------------------- options


OPTIONS = [
    (["bench", "--threads", "100000"], "bench", "--threads", "got 100000"),
    (["probe", "ops", "--threads", "1,100000"], "probe ops", "--threads", "got 100000"),
    (["bench", "--vocab", "100000000000", "--batch", "1"], "bench", "--vocab 100000000000", "GiB"),
    (
        ["rollout", "{tmp}/r.jsonl", "--seed", str(2**63 - 1), "--num-sequences", "3"],
        "rollout",
        f"--seed {2**63 - 1} with --num-sequences 3",
        f"at most {2**63 - 3}",
    ),
    # Bug pinned: --num-sequences 1000000000 built every request in memory before writing
    (
        ["rollout", "{tmp}/r.jsonl", "--num-sequences", "1000000000"],
        "rollout",
        "1,000,000,000 sequences (--num-sequences x --n)",
        "GiB",
    ),
]


def test_audit_workers_are_bounded_by_the_machine(tmp_path, capsys):
    """Bug pinned: ``--workers 100000`` on a file of many lines started a process per
    shard, up to 100000 of them."""
    path = tmp_path / "two.jsonl"
    path.write_text("\n".join(json.dumps(dict(GOOD, id=k)) for k in range(2)) + "\n")
    assert main(["audit", str(path), "--workers", "100000", "--quiet"]) == 2
    line = one_error_line(capsys.readouterr().err, "audit")
    assert "workers must be at most" in line and "got 100000" in line, line


def test_tensor_parallel_rank_groups_are_bounded_by_the_machine():
    from detsample.parallel.group import RankGroup

    with pytest.raises(ValueError, match="tensor-parallel size .* must be at most .* got 100000"):
        RankGroup(100000, init=print)


@pytest.mark.parametrize("argv,command,names,value", OPTIONS, ids=[" ".join(o[0][:2]) for o in OPTIONS])
def test_out_of_range_options_are_named(tmp_path, capsys, argv, command, names, value):
    argv = [a.format(tmp=tmp_path) for a in argv]
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's usage error
        rc = exc.code
    line = one_error_line(capsys.readouterr().err, command)
    assert rc == 2 and names in line and value in line, line
    assert not (tmp_path / "r.jsonl").exists()


# --------------------------------------------------------------------------- outputs


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this OS")
@pytest.mark.parametrize("command", ["audit", "audit-log"])
def test_a_full_disk_names_the_output_path(tmp_path, capsys, command):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(GOOD if command == "audit" else LOG_ROW) + "\n")
    rc = main([command, str(src), "--json", "/dev/full", "--quiet"])
    line = one_error_line(capsys.readouterr().err, command)
    assert rc == 2 and "cannot write --json /dev/full: No space left on device" in line, line


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this OS")
def test_check_never_prints_its_verdict_before_failing_to_write(capsys, monkeypatch):
    from detsample.checks import battery
    from detsample.checks.result import CheckResult

    monkeypatch.setattr(battery, "run_battery", lambda **kw: [CheckResult("x", True, "ok")])
    rc = main(["check", "--json", "/dev/full", "--no-isa-fallback", "--allow-missing-goldens"])
    cap = capsys.readouterr()
    assert rc == 2 and "ALL CHECKS PASSED" not in cap.out, cap.out
    assert "cannot write --json /dev/full: No space left on device" in cap.err


@pytest.mark.parametrize("row,rc,says", [(LOG_ROW, 0, ""), (dict(LOG_ROW, tokens=-1), 2, "<stdin>:line 1: tokens")])
def test_audit_log_reads_stdin_with_the_same_rules(capsys, monkeypatch, row, rc, says):
    import io

    data = (json.dumps(row) + "\n").encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["audit-log", "-", "--quiet", "--max-abs-diff", "0"]) == rc
    assert says in capsys.readouterr().err


def _x86_set_this_cpu_lacks() -> str | None:
    """The highest x86 set torch has that this CPU cannot run (None: it runs them all,
    or it is no x86 CPU)."""
    from detsample.golden import isa

    if not isa._is_x86():
        return None
    missing = [s for s in isa.X86_ORDER if s not in isa.supported_isas()]
    return missing[-1] if missing else None


LACKING = _x86_set_this_cpu_lacks()
#: records every torch call and aten op of ``main(argv)``, imports included
RECORDED_MAIN = textwrap.dedent("""
    import json, sys
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    ops = []
    class Calls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            ops.append(str(func)); return func(*args, **(kwargs or {}))
    class Kernels(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func)); return func(*args, **(kwargs or {}))
    with Calls(), Kernels():
        from detsample.cli import main
        rc = main(sys.argv[1:])
    print(json.dumps({"rc": rc, "ops": ops[:5]}))
""")


def _forced(value: str, *argv: str) -> subprocess.CompletedProcess:
    """``detsample ARGV`` in a fresh process under ``ATEN_CPU_CAPABILITY=value``."""
    repo = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "ATEN_CPU_CAPABILITY": value,
        "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-c", RECORDED_MAIN, *argv], env=env, capture_output=True, text=True, timeout=600
    )


CHECK_ONE = ["check", "--quick", "-k", "random.temperature"]
VERIFY_ONE = ["golden", "verify", "-k", "random.greedy"]


@pytest.mark.parametrize(
    "value,argv",
    [
        pytest.param(
            LACKING or "lacking",
            CHECK_ONE,
            marks=pytest.mark.skipif(
                LACKING is None,
                reason="this CPU runs every x86 set torch has (or is not x86): "
                "no set to force that it lacks; the unknown values still run",
            ),
        ),
        ("avx9000", VERIFY_ONE),
        ("AVX2", CHECK_ONE),
    ],
)
def test_a_forced_set_the_cpu_cannot_run_is_refused_before_any_kernel(value, argv):
    """Bug pinned: ``ATEN_CPU_CAPABILITY=avx512 detsample check`` on an AVX2 CPU died on
    an illegal instruction with no output (torch dispatches a forced set's kernels
    without asking the CPU; a value it does not know it ignores, running another set).
    Every command refuses it first: exit 2, one line, no torch kernel run before."""
    from detsample.golden import isa

    proc = _forced(value, *argv)
    assert proc.stderr == (
        f"detsample: error: ATEN_CPU_CAPABILITY={value}: this CPU supports {', '.join(isa.supported_isas())}\n"
    ), proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"rc": 2, "ops": []}


def test_an_empty_value_is_not_refused():
    """Empty: torch picks the CPU's own set, as when it is unset (and a set the CPU runs:
    tests/cli/test_check.py runs check under each); the command runs."""
    proc = _forced("", *VERIFY_ONE)
    assert json.loads(proc.stdout.splitlines()[-1])["rc"] == 0, proc.stdout + proc.stderr
