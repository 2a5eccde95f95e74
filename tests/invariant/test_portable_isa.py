"""The portable mode gives one set of bits under every ATen instruction set of this CPU.

tests/invariant/portable_hashes.py runs in a fresh process per ``ATEN_CPU_CAPABILITY``
(``default``: ATen's scalar kernels; ``avx2``; ``avx512`` where the CPU has it), since torch
picks its kernels when it loads: the weights hash and the portable logits hash of each tiny
model must be one across them. The same child runs on aarch64 under another harness.

Pins: a pointwise op the portable mode passes through to ATen (its ``silu``, ``sigmoid``,
``cos`` / ``sin`` round differently per set, measured), and test weights drawn by
``torch.randn`` (its vectorised Box-Muller follows the set). Negative control, in the same
children: the first model with ``torch.randn`` weights and with ATen's kernels in the
mode's place gives different hashes under two sets, so the comparison can fail.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cpu_flags() -> set[str]:
    try:
        return set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return set()


def isas() -> list[str]:
    """The ATen instruction sets this CPU can run."""
    flags = _cpu_flags()
    return ["default"] + [s for s, f in (("avx2", "avx2"), ("avx512", "avx512f")) if f in flags]


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("ATen's instruction sets are x86's (aarch64: the emulation harness)")
    if len(isas()) < 2:
        pytest.skip(f"one ATen instruction set on this CPU: {isas()}")
    procs = {}
    for isa in isas():
        env = {
            **os.environ,
            "ATEN_CPU_CAPABILITY": isa,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        procs[isa] = subprocess.Popen(
            [sys.executable, "-m", "tests.invariant.portable_hashes", "--control"],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    out = {}
    for isa, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        assert proc.returncode == 0 and lines, f"ATEN_CPU_CAPABILITY={isa}: exit {proc.returncode}\n{stderr[-3000:]}"
        out[isa] = json.loads(lines[-1])
    return out


def _one_per_model(runs: dict[str, dict], key: str) -> None:
    first = next(iter(runs.values()))[key]
    for isa, res in runs.items():
        differ = {m: (h, first[m]) for m, h in res[key].items() if h != first[m]}
        assert not differ, f"{key} hashes differ under ATEN_CPU_CAPABILITY={isa}: {differ}"


def test_each_child_ran_its_instruction_set(runs):
    assert {res["isa"].lower() for res in runs.values()} == set(runs)


def test_the_weights_are_the_same_bits_under_every_instruction_set(runs):
    _one_per_model(runs, "weights")


def test_the_portable_logits_are_the_same_bits_under_every_instruction_set(runs):
    _one_per_model(runs, "logits")


def test_the_controls_differ_between_instruction_sets(runs):
    """torch.randn weights and ATen's silu / sigmoid / cos / sin in the portable mode: the
    hashes this test compares would move with the set."""
    for key in ("weights", "logits"):
        seen = {json.dumps(res["control"][key]) for res in runs.values()}
        assert len(seen) > 1, f"control {key} did not move with the ATen set: {seen}"
