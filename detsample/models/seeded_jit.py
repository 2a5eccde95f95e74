"""The numba kernel of :mod:`detsample.models.seeded`: Philox4x32-10 in uint64 lanes (each
product of two 32-bit words is exact) and the defined Box-Muller, compiled without
fast-math; imported on first use.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from detsample import rng, rules
from detsample.arith.jit import log64
from detsample.arith.trig_jit import sincos

_jit = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)
M32 = np.uint64(rng.MASK32)
RA = np.uint64(rng.PHILOX_ROUND_A)
RB = np.uint64(rng.PHILOX_ROUND_B)
KA = np.uint64(rng.PHILOX_KEY_A)
KB = np.uint64(rng.PHILOX_KEY_B)
S32 = np.uint64(32)
S20 = np.uint64(20)
S12 = np.uint64(12)


@numba.njit(inline="always", **_jit)
def philox(k0, k1, c0, c1, c2, c3):
    """rng.philox4x32's ten rounds on uint64 values holding 32-bit words."""
    for _ in range(rng.PHILOX_ROUNDS):
        pb = RB * c2
        pa = RA * c0
        c0, c2, c1, c3 = ((pb >> S32) ^ c1 ^ k0, (pa >> S32) ^ c3 ^ k1, pb & M32, pa & M32)
        k0 = (k0 + KA) & M32
        k1 = (k1 + KB) & M32
    return c0, c1, c2, c3


@numba.njit(inline="always", **_jit)
def _uniform(hi, lo):
    """rules.uniform(rules.u52(hi, lo))."""
    n = (hi << S20) | (lo >> S12)
    return (np.float64(n) + 0.5) * rules.U_SCALE


@numba.njit(**_jit)
def normal_pairs(seed, index, stream, two_pi, start, stop, out):
    """out[2j], out[2j + 1] for pair counters j in [start, stop): the definition
    (``stream``: Philox's word c3; ``two_pi``: 2 pi as float64)."""
    s = np.uint64(seed)
    k0 = s & M32
    k1 = (s >> S32) & M32
    c2 = np.uint64(index)
    c3 = np.uint64(stream)
    for j in range(start, stop):
        u = np.uint64(j)
        w0, w1, w2, w3 = philox(k0, k1, u & M32, u >> S32, c2, c3)
        u1 = _uniform(w0, w1)
        u2 = _uniform(w2, w3)
        rho = math.sqrt(log64(u1) * -2.0)
        theta = u2 * two_pi
        out[2 * j] = rho * sincos(theta, False)
        out[2 * j + 1] = rho * sincos(theta, True)
