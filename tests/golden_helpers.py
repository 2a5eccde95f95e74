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
        logprobs=bits.view(np.float32), meta=meta or {"seeds": {"r0": 1}})



def with_top(out: ScenarioOutput, counts, ids=None, bits=None) -> ScenarioOutput:
    """``out`` with top logprobs: ``counts`` per entry, ids and float32 bits (defaults:
    ids 0, 1, ... and bits 0xbf800000 + i)."""
    counts = np.asarray(counts, dtype=np.int64)
    m = int(counts.sum())
    ids = np.arange(m) if ids is None else np.asarray(ids)
    bits = (np.arange(m) + 0xBF800000) if bits is None else np.asarray(bits)
    return ScenarioOutput(out.rids, out.positions, out.tokens, out.logprobs, out.meta,
                          counts, ids.astype(np.int64), bits.astype(np.uint32).view(np.float32))


def snapshot(root) -> dict:
    """Every file under ``root``: relative path -> bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def interrupt_staging_at(monkeypatch, n: int) -> None:
    """Make the golden store's n-th staged file write raise KeyboardInterrupt."""
    import detsample.golden.store as store_mod
    real, calls = store_mod._stage, []

    def flaky(folder, fname, data):
        calls.append(fname)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(folder, fname, data)

    monkeypatch.setattr(store_mod, "_stage", flaky)
