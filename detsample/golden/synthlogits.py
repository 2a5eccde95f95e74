"""Synthetic logits families for golden scenarios, generated from explicit seeds.

Every family is a pure function ``(seed, step, rows, vocab) -> [rows, vocab] float32``.
Only the PCG64 *bit stream* (``random_raw``, stable across numpy versions) and exactly
rounded IEEE ``+``/``*`` are used, never numpy's distribution methods or transcendental
functions (whose SIMD implementations may round differently per machine), so the same
seed gives the same bits on every platform. Manifests also record the sha256 of the
logits, so a golden mismatch can be told apart from an input change.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

_TWO_M53 = 2.0**-53
LogitsFamily = Callable[[int, int, int, int], np.ndarray]


def _uniforms(seed: int, step: int, n: int) -> np.ndarray:
    """[n] float64 uniforms in [0, 1) from PCG64's raw stream keyed by (seed, step)."""
    bg = np.random.PCG64(np.random.SeedSequence([int(seed), int(step)]))
    return (bg.random_raw(n) >> np.uint64(11)).astype(np.float64) * _TWO_M53


def _bell(seed: int, step: int, rows: int, vocab: int, scale: float) -> np.ndarray:
    """Approximately normal values (Irwin-Hall of 4 uniforms), std ~= ``scale``; float64."""
    u = _uniforms(seed, step, 4 * rows * vocab).reshape(4, rows, vocab)
    return ((u[0] + u[1]) + (u[2] + u[3]) - 2.0) * (scale * 1.7320508075688772)


def _choice(seed: int, step: int, n: int, high: int) -> np.ndarray:
    """[n] int64 in [0, high), from the raw stream (stream 1 of the step)."""
    bg = np.random.PCG64(np.random.SeedSequence([int(seed), int(step), 1]))
    return (bg.random_raw(n) % np.uint64(high)).astype(np.int64)


def random_logits(seed: int, step: int, rows: int, vocab: int) -> np.ndarray:
    """Bell-shaped logits, std 3: the common case."""
    return _bell(seed, step, rows, vocab, 3.0).astype(np.float32)


def tie_logits(seed: int, step: int, rows: int, vocab: int) -> np.ndarray:
    """Heavy ties: every logit is one of 4 values {0, 0.5, 1, 1.5}, so argmax, top-k and
    top-p boundaries fall inside runs of equal values (tie-breaking is tested)."""
    u = _uniforms(seed, step, rows * vocab).reshape(rows, vocab)
    return (np.floor(u * 4.0) * 0.5).astype(np.float32)


def one_hot_logits(seed: int, step: int, rows: int, vocab: int) -> np.ndarray:
    """Even rows: -inf everywhere but one 0.0 (an exact one-hot distribution).
    Odd rows: 0 everywhere but one 40.0 (a numerically one-hot distribution)."""
    hot = _choice(seed, step, rows, vocab)
    out = np.zeros((rows, vocab), dtype=np.float32)
    out[0::2] = -np.inf
    out[np.arange(rows), hot] = np.where(np.arange(rows) % 2 == 0, 0.0, 40.0)
    return out


def neg_inf_column_logits(seed: int, step: int, rows: int, vocab: int) -> np.ndarray:
    """Random logits with ~30% of columns -inf in every row, and row 0 with only two
    finite entries (masked vocabularies, as a grammar or allow-list produces)."""
    out = random_logits(seed, step, rows, vocab)
    u = _uniforms(seed + 1, step, vocab)
    out[:, u < 0.3] = -np.inf
    keep = _choice(seed, step, 2, vocab)
    out[0] = -np.inf
    out[0, keep[0]] = 1.0
    out[0, keep[1]] = 0.5
    return out


def nan_row_logits(seed: int, step: int, rows: int, vocab: int) -> np.ndarray:
    """Random logits; row 1 all NaN, row 3 with 10 NaN entries, row 5 (when present)
    with one +inf entry: the sanitiser must keep every other row untouched."""
    out = random_logits(seed, step, rows, vocab)
    if rows > 1:
        out[1] = np.nan
    if rows > 3:
        out[3, _choice(seed, step, 10, vocab)] = np.nan
    if rows > 5:
        out[5, _choice(seed + 2, step, 1, vocab)] = np.inf
    return out


def huge_logits(seed: int, step: int, rows: int, vocab: int) -> np.ndarray:
    """Magnitudes near float32 overflow: bell values with std 2e38, clipped to +-3e38
    (temperature division may overflow; the result must still be deterministic)."""
    v = _bell(seed, step, rows, vocab, 1.0) * 2e38
    return np.clip(v, -3e38, 3e38).astype(np.float32)


FAMILIES: dict[str, LogitsFamily] = {
    "random": random_logits,
    "ties": tie_logits,
    "onehot": one_hot_logits,
    "neginf": neg_inf_column_logits,
    "nan": nan_row_logits,
    "huge": huge_logits,
}
