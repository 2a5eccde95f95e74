"""Counter-based random numbers: Philox4x32-10, laid out as Triton's ``tl.philox``.

``philox4x32(seed, c0, c1, c2, c3)`` reproduces ``triton.language.philox(seed, c0, c1,
c2, c3)`` for 32-bit counters bit for bit: the 64-bit seed is the key (``k0`` = low word,
``k1`` = high word), ten rounds with the Philox constants, the key bumped by the Weyl
constants after each round. A GPU kernel calling ``tl.philox`` with the same inputs
therefore draws the same bits as this CPU implementation.

The sampler draws ONE uniform per row, keyed only by ``(seed, position)``::

    words = philox4x32(seed, pos & 0xffffffff, pos >> 32, STREAM_DRAW, 0)
    n     = (words[0] << 20) | (words[1] >> 12)          # 52 random bits
    u     = (n + 0.5) * 2**-52                           # float64, strictly inside (0, 1)

``u`` is exact in float64 (53 significant bits), never 0 and never 1, so no downstream
``log`` or inverse CDF can be infinite or forced (the SGLang 25106 story: a hash of
0xFFFFFFFF turned into an infinite Gumbel). Nothing about the row index, batch size or
sorted rank enters the key.

All arithmetic is done on int64 tensors holding uint32 values; products of two uint32
values wrap in int64 exactly like uint64, so the high and low words are exact. For CPU
tensors :func:`row_uniforms` runs the same integer rounds on the host, every row in a
64-bit lane of one Python int (about 150 tensor operations per call become the Python
operations of one row: ~7 us for one row, ~20 us for 64, ~0.7 ms for 4096, where numpy
arrays take ~60 us from one row on); integer arithmetic is exact in both forms, so the
bits are the same (tests/test_rng.py).
"""

from __future__ import annotations

import numpy as np
import torch

from detsample import rules

PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
PHILOX_ROUNDS = 10
MASK32 = 0xFFFFFFFF

#: counter word c2 of the per-row draw (other streams may use other values)
STREAM_DRAW = 0
#: name recorded in golden files
RNG_NAME = "philox4x32-10/u52(seed,pos)"


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    prod = b * a  # int64, wraps like uint64 for 32x32-bit operands
    return (prod >> 32) & MASK32, prod & MASK32


def philox4x32(
    seed: torch.Tensor,
    c0: torch.Tensor,
    c1: torch.Tensor,
    c2: torch.Tensor,
    c3: torch.Tensor,
    rounds: int = PHILOX_ROUNDS,
) -> tuple[torch.Tensor, ...]:
    """Philox4x32 on broadcastable int64 tensors.

    seed: int64, any shape (read as uint64: low word = k0, high word = k1).
    c0..c3: int64 holding uint32 values. Returns four int64 tensors of uint32 values.
    Bitwise deterministic; the same bits as ``tl.philox(seed, c0, c1, c2, c3)``.
    """
    k0 = seed & MASK32
    k1 = (seed >> 32) & MASK32
    c0, c1, c2, c3 = (c & MASK32 for c in torch.broadcast_tensors(c0, c1, c2, c3))
    for _ in range(rounds):
        hi_b, lo_b = _mulhilo(PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(PHILOX_ROUND_A, c0)
        c0 = hi_b ^ c1 ^ k0
        c2 = hi_a ^ c3 ^ k1
        c1 = lo_b
        c3 = lo_a
        k0 = (k0 + PHILOX_KEY_A) & MASK32
        k1 = (k1 + PHILOX_KEY_B) & MASK32
    return c0, c1, c2, c3


def _uniforms_in_lanes(seeds: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """:func:`row_uniforms` of R rows on the host, every row in a 64-bit lane of one
    Python int.

    seeds, positions: (R,) integer arrays (non-negative). Philox's operations are lane-wise
    on packed integers: each multiplier is the same 32-bit constant in every lane, so a
    lane's product (< 2**64) never carries into the next; a shift moves bits across
    lanes, and the mask after it (``MASK32`` in every lane) drops exactly those; key
    additions stay below 2**33. So the ten rounds of all R rows cost the Python
    operations of one row, on R-lane integers. Returns (R,) float64, the same bits.
    """
    R = len(seeds)
    one = ((1 << (64 * R)) - 1) // 0xFFFFFFFFFFFFFFFF  # 1 in every lane
    m = MASK32 * one
    S = int.from_bytes(seeds.astype("<i8").tobytes(), "little")
    P = int.from_bytes(positions.astype("<i8").tobytes(), "little")
    k0, k1 = S & m, (S >> 32) & m
    c0, c1, c2, c3 = P & m, (P >> 32) & m, STREAM_DRAW * one, 0
    ka, kb = PHILOX_KEY_A * one, PHILOX_KEY_B * one
    for _ in range(PHILOX_ROUNDS):
        pb, pa = c2 * PHILOX_ROUND_B, c0 * PHILOX_ROUND_A
        c0, c2, c1, c3 = ((pb >> 32) & m) ^ c1 ^ k0, ((pa >> 32) & m) ^ c3 ^ k1, pb & m, pa & m
        k0, k1 = (k0 + ka) & m, (k1 + kb) & m
    # rules.u52 in every lane (the shift's bits that cross into the lane below dropped)
    n = (c0 << 20) | ((c1 >> 12) & (((1 << (rules.U_BITS - 32)) - 1) * one))
    return rules.uniform(np.frombuffer(n.to_bytes(8 * R, "little"), dtype="<u8"))


def row_uniforms(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One uniform per row, keyed only by ``(seed, position)``.

    seeds: (batch,) int64 (non-negative). positions: (batch,) int64 (non-negative).
    Returns (batch,) float64 in the open interval (0, 1), bitwise reproducible, the same
    bits on every device (CPU tensors take the rounds on the host, in the lanes of one
    Python int; other devices the tensor rounds).
    """
    if seeds.device.type == "cpu" and positions.device.type == "cpu":
        if seeds.numel() == 0:
            return torch.empty((0,), dtype=torch.float64)
        return torch.from_numpy(_uniforms_in_lanes(seeds.to(torch.int64).numpy(), positions.to(torch.int64).numpy()))
    seeds = seeds.to(torch.int64)
    positions = positions.to(torch.int64)
    zero = torch.zeros_like(positions)
    w0, w1, _, _ = philox4x32(seeds, positions & MASK32, (positions >> 32) & MASK32, zero + STREAM_DRAW, zero)
    return rules.uniform(rules.u52(w0, w1))
