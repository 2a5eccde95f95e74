"""detsample's seeded normal values (detsample/models/seeded.py's definition) in plain
Python: Philox from oracles.rng, the uniform, log64 from oracles.arith, cos / sin from
oracles.trig, math.sqrt (IEEE). Reproduces the package's bits exactly."""

from __future__ import annotations

import math

import numpy as np

from oracles import arith, rng, trig

STREAM = 0x57454947


def normals(seed: int, index: int, n: int) -> np.ndarray:
    """n float64 values of parameter ``index`` under ``seed``."""
    out = []
    for j in range((n + 1) // 2):
        w0, w1, w2, w3 = rng.philox4x32(seed, j & rng.M32, j >> 32, index, STREAM)
        u1 = (((w0 << 20) | (w1 >> 12)) + 0.5) * 2.0**-52
        u2 = (((w2 << 20) | (w3 >> 12)) + 0.5) * 2.0**-52
        rho = math.sqrt(-2.0 * arith.log64(u1))
        theta = np.array([(2.0 * math.pi) * u2])
        out += [rho * float(trig.cos(theta)[0]), rho * float(trig.sin(theta)[0])]
    return np.array(out[:n])
