"""Philox4x32-10 in plain Python integers: the specification of detsample.rng."""

from __future__ import annotations

M32 = 0xFFFFFFFF
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85
ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57


def philox4x32(seed: int, c0: int, c1: int, c2: int, c3: int, rounds: int = 10):
    """Four uint32 words, exactly as Triton's tl.philox(seed, c0, c1, c2, c3)."""
    k0, k1 = seed & M32, (seed >> 32) & M32
    for _ in range(rounds):
        p_b = ROUND_B * c2
        p_a = ROUND_A * c0
        c0, c1, c2, c3 = ((p_b >> 32) ^ c1 ^ k0) & M32, p_b & M32, ((p_a >> 32) ^ c3 ^ k1) & M32, p_a & M32
        k0, k1 = (k0 + KEY_A) & M32, (k1 + KEY_B) & M32
    return c0, c1, c2, c3


def row_uniform(seed: int, position: int) -> float:
    """The per-row uniform in (0, 1): 52 bits from two Philox words, centred."""
    w0, w1, _, _ = philox4x32(seed, position & M32, (position >> 32) & M32, 0, 0)
    n = (w0 << 20) | (w1 >> 12)
    return (n + 0.5) * 2.0**-52
