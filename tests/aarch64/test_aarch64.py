"""The same bits on an aarch64 CPU as on this x86 machine, by emulation (opt-in).

``ci/aarch64.sh`` keeps a Debian arm64 root with PyPI's aarch64 torch, numba and the
project's dependencies, and runs a command in it under QEMU user mode (an emulated Arm
Neoverse N1 by default). tests/aarch64/child.py writes the bits of one part to a folder;
each test runs it natively and under emulation and compares the two byte for byte (never
a tolerance):

* the golden scenarios (every registered one: synthetic sampler scenarios and the engine
  schedules): positions, token ids, logprobs, top logprob ids and values;
* ``detsample.arith``: ``exp``, ``exp64``, ``log64``, ``normalisers``, ``log_softmax``,
  ``row_max`` on fixed inputs, ``impl="numba"`` and ``impl="torch"``;
* the batch-invariant mode on a tiny Llama under aarch64: decode == prefill == chunked
  prefill == left/right-padded batch, verified and portable kernels, 1 and 2 threads; the
  portable logits (platform-independent weights) equal the native ones; and the tiny
  models' seeded weights (``seeded_init_``, what ``engine.hf-tiny-llama.invariant`` runs
  on) equal the native ones.

Run: ``python -m pytest -m aarch64 tests/aarch64`` (as root, after
``bash ci/aarch64.sh setup``); about 8 minutes on a 2-core machine, most of it emulation
(each emulated process spends ~30 s importing torch). Without the root every test is
skipped and says how to make it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from detsample.golden import registry

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "ci" / "aarch64.sh"
CHILD = Path(__file__).with_name("child.py")
AROOT = Path(os.environ.get("DETSAMPLE_AARCH64_ROOT") or Path.home() / ".cache/detsample/aarch64-root")


def _unavailable() -> str | None:
    if not (AROOT / ".detsample-setup-done").exists():
        return (
            f"no arm64 root at {AROOT}: make it with `bash ci/aarch64.sh setup` (as root; "
            "~15 min, ~4 GiB; docs/golden.md 'aarch64 under emulation'), or point "
            "DETSAMPLE_AARCH64_ROOT at one"
        )
    if os.geteuid() != 0:
        return "ci/aarch64.sh run needs root (chroot and bind mounts)"
    if shutil.which("unshare") is None or not Path("/usr/bin/qemu-aarch64-static").exists():
        return "unshare or /usr/bin/qemu-aarch64-static missing (apt-get install util-linux qemu-user-static)"
    return None


pytestmark = [pytest.mark.aarch64, pytest.mark.skipif(_unavailable() is not None, reason=str(_unavailable()))]


class Bits:
    """One child run's folder: ``result.json`` and the raw arrays."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.result = json.loads((folder / "result.json").read_text())

    def raw(self, part: str, key: str) -> bytes:
        return (self.folder / part / f"{key}.bin").read_bytes()

    def array(self, part: str, key: str) -> np.ndarray:
        dtype, shape = self.result["shapes"][key]
        return np.frombuffer(self.raw(part, key), dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)


def _run(where: str, out: Path, part: str, *args: str, timeout: int) -> Bits:
    out.mkdir(parents=True, exist_ok=True)
    if where == "native":
        argv, env = [sys.executable, str(CHILD)], dict(os.environ)
    else:
        argv = ["bash", str(SCRIPT), "run", "python", "tests/aarch64/child.py"]
        env = {**os.environ, "DETSAMPLE_AARCH64_BIND": str(out)}
    proc = subprocess.run(
        argv + [str(out), part, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0 and (out / "result.json").exists(), (
        f"{where} child ({part}) failed, exit {proc.returncode}:\n{proc.stderr[-4000:]}"
    )
    bits = Bits(out)
    if where == "emulated":
        assert bits.result["machine"] == "aarch64", bits.result
    return bits


def _pair(tmp_path_factory, part: str, *args: str, timeout: int) -> tuple[Bits, Bits]:
    base = tmp_path_factory.mktemp(f"aarch64-{part}")
    return (
        _run("native", base / "native", part, *args, timeout=timeout),
        _run("emulated", base / "emulated", part, *args, timeout=timeout),
    )


@pytest.fixture(scope="module")
def scenario_bits(tmp_path_factory):
    return _pair(tmp_path_factory, "scenarios", timeout=1800)


@pytest.fixture(scope="module")
def arith_bits(tmp_path_factory):
    return _pair(tmp_path_factory, "arith", timeout=900)


@pytest.fixture(scope="module")
def invariant_bits(tmp_path_factory):
    return _pair(tmp_path_factory, "invariant", timeout=1800)


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distances in units in the last place of float arrays of one dtype (NaN: -1)."""
    ints = {4: np.int32, 8: np.int64}[a.dtype.itemsize]
    ia, ib = a.view(ints).astype(np.int64), b.view(ints).astype(np.int64)
    ia = np.where(ia < 0, np.iinfo(ints).min - ia, ia)  # sign-magnitude -> ordered
    ib = np.where(ib < 0, np.iinfo(ints).min - ib, ib)
    d = np.abs(ia - ib)
    return np.where(np.isnan(a) | np.isnan(b), -1, d)


def _difference(name: str, a: np.ndarray, b: np.ndarray) -> str | None:
    """None when the two arrays are the same bytes, else how they differ."""
    if a.shape != b.shape:
        return f"{name}: shape {a.shape} natively, {b.shape} on aarch64"
    if a.tobytes() == b.tobytes():
        return None
    moved = a.view(np.uint8).reshape(a.size, -1) != b.view(np.uint8).reshape(b.size, -1)
    idx = np.flatnonzero(moved.any(axis=1))
    text = f"{name}: {idx.size} of {a.size} values differ in bits"
    if a.dtype.kind == "f":
        u = _ulps(a.reshape(-1)[idx], b.reshape(-1)[idx])
        hist = Counter("NaN" if x < 0 else str(x) if x <= 4 else "5-16" if x <= 16 else ">16" for x in u)
        text += f" (ulp histogram {dict(sorted(hist.items()))}, max {u.max()})"
    i = idx[0]
    return text + f"; first at {i}: {a.reshape(-1)[i]!r} natively, {b.reshape(-1)[i]!r} on aarch64"


SCENARIO_ARRAYS = ("positions", "tokens", "logprobs", "top_counts", "top_ids", "top_logprobs")


@pytest.mark.parametrize("name", registry.names())
def test_scenario_bits_equal_native(scenario_bits, name):
    """Each golden scenario's canonical run: the same token ids, logprobs and top logprobs,
    bit for bit, on an emulated aarch64 CPU as natively (golden/cpu is one folder for
    every CPU, aarch64 included; docs/golden.md)."""
    native, emulated = scenario_bits
    diffs = [
        d
        for key in SCENARIO_ARRAYS
        if (
            d := _difference(
                key, native.array("scenarios", f"{name}.{key}"), emulated.array("scenarios", f"{name}.{key}")
            )
        )
    ]
    assert not diffs, f"{name} under aarch64 ({emulated.result['torch']}): " + "; ".join(diffs)


ARITH = ("exp", "exp64", "log64", "normalisers", "log_softmax", "row_max")


@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("fn", ARITH)
def test_arith_bits_equal_native(arith_bits, fn, impl):
    """detsample's own arithmetic gives the same bytes on aarch64 as natively, numba
    kernels and torch composition alike (tests/arith pins them against the oracle)."""
    native, emulated = arith_bits
    keys = sorted(k.split(".", 1)[1] for k in native.result["shapes"] if k.startswith(f"{impl}."))
    keys = [k for k in keys if k == fn or k.startswith(f"{fn}_")]
    assert keys, f"no arrays of {fn}"
    diffs = [
        d
        for k in keys
        if (d := _difference(k, native.array("arith", f"{impl}.{k}"), emulated.array("arith", f"{impl}.{k}")))
    ]
    assert not diffs, f"arith.{fn} impl={impl}: " + "; ".join(diffs)


def test_batch_invariant_mode_holds_under_aarch64(invariant_bits):
    """decode == prefill == chunked prefill == padded batch, 1 and 2 threads, verified and
    portable kernels, on the emulated CPU (and natively, the reference)."""
    native, emulated = invariant_bits
    assert not native.result["failures"], f"natively: {native.result['failures']}"
    assert not emulated.result["failures"], f"under aarch64: {emulated.result['failures']}"


def test_portable_logits_equal_native(invariant_bits):
    """The portable mode's logits (weights of platform-independent bits) are the native
    ones, bit for bit, at 1 and 2 threads: its bits are detsample's algorithm's."""
    native, emulated = invariant_bits
    diffs = [
        d
        for t in (1, 2)
        if (
            d := _difference(
                f"{t} thread(s)",
                native.array("invariant", f"portable_logits_{t}t.logits"),
                emulated.array("invariant", f"portable_logits_{t}t.logits"),
            )
        )
    ]
    assert not diffs, "portable logits under aarch64: " + "; ".join(diffs)


OPS = (
    "exp",
    "log",
    "silu",
    "sigmoid",
    "tanh",
    "rsqrt",
    "sqrt",
    "cos",
    "sin",
    "softmax",
    "pow",
    "rotary_cos",
    "rotary_sin",
)


@pytest.mark.parametrize("op", OPS)
def test_portable_mode_op_equals_native(invariant_bits, op):
    """Each elementwise op a decoder runs (and the Llama's rotary cos / sin table) gives the
    native bits under the portable mode on aarch64: where the portable logits differ, these
    name the op whose bits are the platform's."""
    native, emulated = invariant_bits
    d = _difference(op, native.array("invariant", f"ops.{op}"), emulated.array("invariant", f"ops.{op}"))
    assert d is None, f"under batch_invariant(portable=True) on aarch64: {d}"


def test_tiny_model_weights_equal_native(invariant_bits):
    """``seeded_init_`` (the tiny models' weights, what ``engine.hf-tiny-llama.invariant``
    and the invariance tests run on) gives the same weights on aarch64: its bits feed a
    golden of the one folder every CPU shares."""
    native, emulated = invariant_bits
    assert native.raw("invariant", "weights_defined.all") == emulated.raw("invariant", "weights_defined.all")
    d = _difference(
        "weights",
        native.array("invariant", "weights_seeded_init.all"),
        emulated.array("invariant", "weights_seeded_init.all"),
    )
    assert d is None, f"seeded_init_ (torch.randn) under aarch64: {d}"
