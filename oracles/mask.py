"""float64 numpy oracle of detsample/ops/mask.py (per-row, per-token loops; no torch)."""

from __future__ import annotations

import numpy as np


def token_allowed(bitmask_row: np.ndarray, t: int, limit: int | None = None) -> bool:
    """Bit ``t % 32`` of word ``t // 32`` (xgrammar's layout); False past the bitmask's
    width or past ``limit``."""
    if t // 32 >= len(bitmask_row) or (limit is not None and t >= limit):
        return False
    word = int(bitmask_row[t // 32]) & 0xFFFFFFFF
    return (word >> (t % 32)) & 1 == 1


def apply_token_bitmask(logits: np.ndarray, bitmask: np.ndarray, rows=None, limit: int | None = None) -> np.ndarray:
    """A float64 copy of ``logits`` with -inf on tokens disallowed in the listed rows."""
    out = np.array(logits, dtype=np.float64, copy=True)
    b, v = out.shape
    for r in range(b) if rows is None else rows:
        for t in range(v):
            if not token_allowed(bitmask[r], t, limit):
                out[r, t] = -np.inf
    return out
