"""detsample's defined cos and sin (detsample/arith/trig.py's text), written on their own:
the Cody-Waite reduction in numpy float64, the Payne-Hanek one in Python's exact
integers (``(M * G) mod 2**170`` as one big product, where the package takes 24-bit limbs),
the Taylor polynomials in Horner's order. Reproduces the package's bits exactly;
float64 -> float64 (``oracles.elementary.to32`` rounds once to float32).
"""

from __future__ import annotations

import math
import struct

import numpy as np

CW_MAX = 2.0**20
INV_PIO2 = float.fromhex("0x1.45f306dc9c883p-1")
PIO2 = float.fromhex("0x1.921fb54442d18p+0")
P1, P2, P3 = (float.fromhex(h) for h in ("0x1.921fb544p+0", "0x1.0b4611a6p-34", "0x1.3198a2ep-69"))
P3T = float.fromhex("0x1.b839a252049c1p-104")
SHIFT = 1.5 * 2.0**52
#: 2/pi's first 1152 bits after the point, as one integer (floor(2/pi * 2**1152))
TWO_OVER_PI = int(
    "a2f9836e4e441529fc2757d1f534ddc0db6295993c439041fe5163abdebbc561b7246e3a"
    "424dd2e006492eea09d1921cfe1deb1cb129a73ee88235f52ebb4484e99c7026b45f7e41"
    "3991d639835339f49c845f8bbdf9283b1ff897ffde05980fef2f118b5a0a6d1f6d367ecf"
    "27cb09b74f463f669e5fea2d7527bac7ebe5f17b3d0739f78a5292ea6bfb5fb11f8d5d08",
    16,
)
SIN = [(-1.0) ** j / math.factorial(2 * j + 1) for j in range(9)]
COS = [(-1.0) ** j / math.factorial(2 * j) for j in range(9)]


def _payne_hanek(a: float) -> tuple[int, float]:
    """(n, r) of a finite a > CW_MAX, by exact integers."""
    bits = struct.unpack("<q", struct.pack("<d", a))[0]
    e = (bits >> 52) - 1075
    m = (bits & ((1 << 52) - 1)) | (1 << 52)
    g = (TWO_OVER_PI >> (1152 - (e + 168))) % (1 << 192)  # floor(2**(e+168) 2/pi) mod 2**192
    y = (m * g) % (1 << 170)
    n, f = y >> 168, y % (1 << 168)
    neg = f >= 1 << 167
    if neg:
        n, f = n + 1, (1 << 168) - f
    g1, g2, g3, g4 = f >> 120, (f >> 72) % (1 << 48), (f >> 24) % (1 << 48), f % (1 << 24)
    s = ((g1 * 2.0**-48 + g2 * 2.0**-96) + g3 * 2.0**-144) + g4 * 2.0**-168
    r = s * PIO2
    return n, -r if neg else r


def reduce(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n in 0..3, r) of finite float64 values: x = n pi/2 + r."""
    x = np.asarray(x, dtype=np.float64)
    t = x * INV_PIO2 + SHIFT
    k = t - SHIFT
    with np.errstate(invalid="ignore"):
        n = k.astype(np.int64) & 3  # huge |x|: replaced below
    r = (((x - k * P1) - k * P2) - k * P3) - k * P3T
    for i in np.nonzero(np.abs(x) > CW_MAX)[0]:
        nb, rb = _payne_hanek(abs(float(x[i])))
        n[i], r[i] = ((-nb) & 3, -rb) if x[i] < 0 else (nb & 3, rb)
    return n, r


def _sincos(x, want_sin: bool) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    ok = np.isfinite(x)
    n, r = reduce(np.where(ok, x, 0.0))
    w = r * r
    S = SIN[8]
    for j in range(7, 0, -1):
        S = S * w + SIN[j]
    C = COS[8]
    for j in range(7, 1, -1):
        C = C * w + COS[j]
    s = r + (r * w) * S
    c = 1.0 - (0.5 * w - (w * w) * C)
    table = [s, c, -s, -c] if want_sin else [c, -s, -c, s]
    y = np.choose(n, table)
    if want_sin:
        y = np.where(x == 0, x, y)
    return np.where(ok, y, np.nan)


def sin(x) -> np.ndarray:
    return _sincos(x, True)


def cos(x) -> np.ndarray:
    return _sincos(x, False)
