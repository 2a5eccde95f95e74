"""Shared helpers of the golden tests (hand-made scenario outputs)."""

from __future__ import annotations

import numpy as np

from detsample.golden.format import ScenarioOutput


def make(bits, tokens=None, rids=None, positions=None, meta=None) -> ScenarioOutput:
    bits = np.asarray(bits, dtype=np.uint32)
    n = bits.size
    return ScenarioOutput(
        rids=tuple(rids or [f"r{i % 2}" for i in range(n)]),
        positions=np.asarray(positions if positions is not None else np.arange(n) + 3),
        tokens=np.asarray(tokens if tokens is not None else np.arange(n) * 7, dtype=np.int64),
        logprobs=bits.view(np.float32),
        meta=meta or {"seeds": {"r0": 1}},
    )


def with_top(out: ScenarioOutput, counts, ids=None, bits=None) -> ScenarioOutput:
    """``out`` with top logprobs: ``counts`` per entry, ids and float32 bits (defaults:
    ids 0, 1, ... and bits 0xbf800000 + i)."""
    counts = np.asarray(counts, dtype=np.int64)
    m = int(counts.sum())
    ids = np.arange(m) if ids is None else np.asarray(ids)
    bits = (np.arange(m) + 0xBF800000) if bits is None else np.asarray(bits)
    return ScenarioOutput(
        out.rids,
        out.positions,
        out.tokens,
        out.logprobs,
        out.meta,
        counts,
        ids.astype(np.int64),
        bits.astype(np.uint32).view(np.float32),
    )


def snapshot(root) -> dict:
    """Every file under ``root``: relative path -> bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def interrupt_staging_at(monkeypatch, n: int) -> None:
    """Make the golden store's n-th staged file write raise KeyboardInterrupt."""
    import detsample.golden.store as store_mod

    real, calls = store_mod.stage_file, []

    def flaky(path, data):
        calls.append(path)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(path, data)

    monkeypatch.setattr(store_mod, "stage_file", flaky)


def another_machine(monkeypatch) -> None:
    """Make the golden store record another machine's provenance (ISA, MKL level, library
    version: its ``PROVENANCE_FIELDS``) under the same platform fingerprint."""
    import detsample.golden.store as store_mod
    import detsample.version

    monkeypatch.setattr(
        store_mod, "platform_info", lambda device="cpu": {"device": "cpu", "isa": "avx2", "torch": "other"}
    )
    monkeypatch.setattr(
        store_mod.isa,
        "dispatch_info",
        lambda: {"mode": "native", "machine_isa": "avx2", "mkl": "AVX2", "vml": "0123456789ab"},
    )
    monkeypatch.setattr(detsample.version, "__version__", "9.9.9")


def git_status(root) -> str:
    """``git status --porcelain`` of a repository at ``root`` (what ``git diff`` would show,
    untracked files included)."""
    import subprocess

    return subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain"], check=True, capture_output=True, text=True
    ).stdout


def git_commit_all(root) -> None:
    """A repository at ``root`` with every file under it committed."""
    import subprocess

    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "goldens"],
    ):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
