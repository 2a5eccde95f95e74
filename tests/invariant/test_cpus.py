"""The mode's invariance on other CPUs' BLAS code paths, emulated.

MKL picks its kernels from the CPU's vendor and features, so the bits (and the
invariance) of the verified kernels on an AMD EPYC are not those of an Intel Xeon. QEMU's
user-mode emulator (``qemu-x86_64 -cpu MODEL``, Debian package ``qemu-user``) runs a
process with another CPU's identity on any x86 host: MKL then takes that vendor's path (an
emulated EPYC-Rome reproduced a real EPYC's bits exactly). tests/invariant/cpus_child.py
checks the properties in that one process and prints its failures and the portable
results' hashes.

Pins: MKL's AMD path rounding a 1-row product by its output row's alignment (the verified
kernels wrote 1-row tiles into rows of one shared output: rows 1, 2, 3, 5, ... of a
K = 160, N = 7 product differed from the row alone under ``-cpu EPYC-Rome``, not under
``-cpu Haswell``), any portable result that depends on the CPU, and a child that left the
parent's virtualenv (it ran the base interpreter behind the venv's ``bin/python`` symlink,
so it lacked the venv's packages: the child now runs ``sys.executable`` as it is).

The default run: the narrow products under the emulated EPYC (about a minute on an idle
2-core machine). ``pytest -m cpus tests/invariant/test_cpus.py``: products in both
layouts at odd shapes, batched products, sums, pointwise ops, a tiny Llama's and two
hybrids' (a gated delta-net Qwen3.5 and a Mamba 2 Nemotron-H, through transformers' cache)
prefill == decode == chunked prefill == padded batch, under EPYC-Rome and Haswell and
natively, the portable hashes equal across all three. Without qemu the tests are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("cpus_child.py")
ROOT = Path(__file__).resolve().parents[2]
QEMU = shutil.which("qemu-x86_64")
needs_qemu = pytest.mark.skipif(
    QEMU is None, reason="qemu-x86_64 not found: install Debian's qemu-user to test other CPUs' MKL paths"
)


def interpreter(cpu: str, python: str = sys.executable) -> list[str]:
    """The argv that starts ``python`` under ``cpu`` ("native" or a QEMU CPU model), in
    ``python``'s own environment: the path is passed as it is, never resolved, since a
    virtualenv's ``bin/python`` is a symlink to the base interpreter and Python finds its
    venv (``pyvenv.cfg``, site-packages) from that path; QEMU passes it as argv[0]."""
    return [python] if cpu == "native" else [QEMU, "-cpu", cpu, python]


def run_child(cpu: str, checks: list[str]) -> dict:
    """cpus_child.py under ``cpu`` ("native" or a QEMU CPU model) in this process's
    environment, torch's AVX2 kernels (emulated CPUs have no AVX-512; the same ATen set
    everywhere keeps the hashes comparable)."""
    env = {
        **os.environ,
        "ATEN_CPU_CAPABILITY": "avx2",
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("MKL_ENABLE_INSTRUCTIONS", None)
    proc = subprocess.run(
        interpreter(cpu) + [str(CHILD), *checks],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        cwd=CHILD.parent,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    errors = "\n".join(ln for ln in proc.stderr.splitlines() if "TCG doesn't support" not in ln)
    assert lines, f"-cpu {cpu}: no result (exit {proc.returncode}):\n{errors[-3000:]}"
    res = json.loads(lines[-1])
    assert proc.returncode == 0 and not res["failures"], f"-cpu {cpu}: {res['failures'][:20]}"
    return res


@pytest.mark.parametrize("cpu", ["native", pytest.param("Haswell", marks=needs_qemu)])
def test_the_child_runs_in_the_parents_virtualenv(cpu, tmp_path):
    """Pins: the child started as ``realpath(sys.executable)``, the base interpreter behind a
    venv's symlink, so from a venv whose packages the base lacks it died on ``import torch``."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, symlinks=True, with_pip=False)
    argv = interpreter(cpu, str(env_dir / "bin" / "python")) + ["-c", "import sys; print(sys.prefix)"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert Path(proc.stdout.strip()).resolve() == env_dir.resolve(), f"-cpu {cpu}: the child left the venv"


@needs_qemu
def test_narrow_products_are_invariant_on_the_emulated_epyc():
    res = run_child("EPYC-Rome", ["narrow"])
    assert all(len(h) == 1 for h in res["hashes"].values()), res["hashes"]


@pytest.mark.cpus
@needs_qemu
def test_every_property_on_amd_and_intel_paths_and_portable_bits_are_one():
    checks = ["products", "sums", "pointwise", "model", "hybrids"]
    results = {cpu: run_child(cpu, checks) for cpu in ("native", "EPYC-Rome", "Haswell")}
    for name in checks:
        seen = {cpu: tuple(r["hashes"][name]) for cpu, r in results.items()}
        assert len(set(seen.values())) == 1 and all(len(h) == 1 for h in seen.values()), (
            f"portable {name} differ between CPUs or thread counts: {seen}"
        )
