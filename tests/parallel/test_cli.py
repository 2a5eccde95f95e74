"""``--tp`` on ``probe model``, ``rollout`` and ``audit``: usage errors before any rank starts
(default suite), and the issue's end-to-end runs as a user types them (opt-in ``tp_full``:
each spawns rank processes that import torch and transformers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from detsample.cli import main
from tests.parallel import models

ROOT = Path(__file__).resolve().parents[2]

USAGE = [
    (["probe", "model", "hf-tiny-qwen2", "--tp", "1,2"], "tp=2 does not divide config.num_attention_heads=5"),
    (
        ["probe", "model", "hf-tiny-llama", "--batch-invariant", "--tp", "2"],
        "--tp 2: tensor parallelism under the batch-invariant mode needs its portable kernels",
    ),
    (["probe", "model", "hf-tiny-llama", "--tp", "1,0"], "must be a comma list of TP sizes"),
    (["probe", "model", "refmodel", "--tp", "2"], "tensor parallel runs Hugging Face causal LMs"),
    (["probe", "model", models.GPT2, "--tp", "2"], "model_type 'gpt2' (GPT2LMHeadModel) is not supported"),
    (
        ["probe", "model", models.OLMOE, "--tp", "2"],
        "model_type 'olmoe' (OlmoeForCausalLM) is not supported (its QK-norm normalises all heads together",
    ),
    (
        ["rollout", "OUT.jsonl", "--model", "hf-tiny-llama", "--batch-invariant", "--tp", "2"],
        "needs its portable kernels",
    ),
    (
        ["rollout", "OUT.jsonl", "--model", "hf-tiny-qwen2", "--tp", "2"],
        "tp=2 does not divide config.num_attention_heads=5",
    ),
    (["audit", "IN.jsonl", "--tp", "2"], "--tp 2 applies to the --rescore model"),
    (
        ["audit", "IN.jsonl", "--rescore", "hf-tiny-llama", "--batch-invariant", "--tp", "2"],
        "needs its portable kernels",
    ),
]


def _exit_code(args: list[str]) -> int:
    """main()'s exit code, argparse's usage errors (SystemExit) included."""
    try:
        return main(args)
    except SystemExit as e:
        return int(e.code)


@pytest.mark.parametrize("args, message", USAGE, ids=[m for _, m in USAGE])
def test_usage_errors_exit_2(tmp_path, capsys, args, message):
    args = [str(tmp_path / a) if a.endswith(".jsonl") else a for a in args]
    (tmp_path / "IN.jsonl").write_text("")
    assert _exit_code(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# -- opt-in: the "done when", as a user runs it ----------------------------------


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "detsample", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def _tp_check(path: Path) -> dict:
    return next(c for c in json.loads(path.read_text())["checks"] if c["name"] == "tensor_parallel")


@pytest.mark.tp_full
@pytest.mark.parametrize("model", ["hf-tiny-llama", models.UNSEEN, models.QWEN3_MOE, models.DEEPSEEK, models.ODD_VOCAB])
def test_probe_passes_under_the_portable_mode_and_fails_without(tmp_path, model):
    on = _cli(
        "probe",
        "model",
        model,
        "--batch-invariant",
        "--portable",
        "--tp",
        "1,2,4",
        "--json",
        str(tmp_path / "on.json"),
        cwd=tmp_path,
    )
    assert on.returncode == 0, on.stdout + on.stderr
    assert _tp_check(tmp_path / "on.json")["ok"]
    off = _cli("probe", "model", model, "--tp", "1,2,4", "--json", str(tmp_path / "off.json"), cwd=tmp_path)
    assert off.returncode == 1, off.stdout + off.stderr
    check = _tp_check(tmp_path / "off.json")
    assert not check["ok"] and check["first_divergence"]["op"] is not None


@pytest.mark.tp_full
def test_tp2_rollout_audits_exact_against_tp1_and_mismatches_without_the_mode(tmp_path):
    for flags, want in ((["--batch-invariant", "--portable"], 0), ([], 1)):
        out = tmp_path / f"r{len(flags)}.jsonl"
        r = _cli(
            "rollout",
            str(out),
            "--model",
            "hf-tiny-llama",
            *flags,
            "--tp",
            "2",
            "--num-sequences",
            "4",
            "--max-new-tokens",
            "8",
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stderr
        a = _cli(
            "audit",
            str(out),
            "--rescore",
            "hf-tiny-llama",
            *flags,
            "--max-abs-diff",
            "0",
            "--min-exact-match",
            "1",
            "--json",
            str(tmp_path / "a.json"),
            "--quiet",
            cwd=tmp_path,
        )
        assert a.returncode == want, a.stderr
        rep = json.loads((tmp_path / "a.json").read_text())
        assert (rep["exact_match_fraction"] == 1.0) == (want == 0)
        b = _cli(
            "audit",
            str(out),
            "--rescore",
            "hf-tiny-llama",
            *flags,
            "--tp",
            "4",
            "--max-abs-diff",
            "0",
            "--min-exact-match",
            "1",
            "--quiet",
            cwd=tmp_path,
        )
        assert b.returncode == want, b.stderr
