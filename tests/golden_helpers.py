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

