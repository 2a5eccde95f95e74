"""The definition of detsample's ``cos`` and ``sin`` of float64 values: the argument
reduction and the polynomials, as a sequence of IEEE operations (the conventions of
:mod:`detsample.arith.elementary`: no FMA, float32 inputs enter exactly and their result
is rounded once, canonical NaNs). Implementations: :mod:`detsample.arith.trig_jit`
(numba), :mod:`detsample.arith.trig_torch` (torch), ``oracles/trig.py`` (numpy and Python
integers).

Why its own: a rotary embedding's tables are ``cos`` / ``sin`` of ``position * inv_freq``,
up to ~1e5 radians for long contexts (more for million-token ones), and torch's kernels
round them differently on aarch64 and on each x86 ATen set.

**Reduction** of ``x`` to ``x = n pi/2 + r``, ``|r| <= ~pi/4``, ``n`` mod 4:

* ``|x| <= CW_MAX`` (2**20), Cody-Waite: ``pi/2 = P1 + P2 + P3 + P3T`` where P1, P2 and P3
  are pi/2's leading three 33-bit pieces (so ``k * Pi`` is exact for ``|k| < 2**20``) and
  P3T the rest, rounded::

      t = x * INV_PIO2 + SHIFT;  k = t - SHIFT;  n = (bits(t) - SHIFT_BITS) & 3
      r = (((x - k * P1) - k * P2) - k * P3) - k * P3T

  Each subtraction is exact where it cancels (Sterbenz) and rounds relative to a value
  within ``k * P2 < 1e-4`` of ``r`` otherwise, so ``r`` is within ~2 ulps of ``x - k pi/2``.

* ``|x| > CW_MAX`` (Payne-Hanek, in integers): with ``|x| = M 2**e`` (``M`` the 53-bit
  integer significand), ``G = floor(2**(e + 168) * 2/pi) mod 2**192`` (the 192 bits of 2/pi
  from position ``e - 23`` on: ``TWO_OVER_PI`` below; the bits above it make multiples of 4)::

      Y = (M * G) mod 2**170                       # |x| 2/pi mod 4, as Y / 2**168, exactly
                                                   # (error < M 2**-168 <= 2**-115 from the
                                                   # bits of 2/pi left out)
      n = Y >> 168;  F = Y mod 2**168              # quadrant, fraction in units of 2**-168
      F >= 2**167: n = n + 1;  F = 2**168 - F;  neg = 1   else neg = 0
      F = g1 2**120 + g2 2**72 + g3 2**24 + g4     # three 48-bit words and one of 24 bits
      s = ((g1 * 2**-48 + g2 * 2**-96) + g3 * 2**-144) + g4 * 2**-168
      r = s * PIO2;  r = -r if neg
      x < 0: n = -n, r = -r;  n = n & 3

  In the implementations ``M * G`` is taken by 24-bit limbs (``M`` in three, ``G`` in
  eight), products below 2**48 and column sums below 2**50: exact in int64 everywhere.

**Polynomials** on ``r`` (``w = r * r``; Taylor coefficients ``(-1)**j / j!``, rounded;
Horner from the highest)::

    S = SIN_COEFS[8]; S = S * w + SIN_COEFS[j] for j = 7 .. 1;   sin_r = r + (r * w) * S
    C = COS_COEFS[8]; C = C * w + COS_COEFS[j] for j = 7 .. 2;   cos_r = 1 - (0.5 * w - (w * w) * C)

    sin(x) = ( sin_r,  cos_r, -sin_r, -cos_r)[n]      sin(+-0) = +-0
    cos(x) = ( cos_r, -sin_r, -cos_r,  sin_r)[n]      +-inf, NaN: NaN

``SIN_COEFS[j] = (-1)**j / (2j + 1)!`` (j = 1..8: to r**17; the next term < 1.2e-19
relative on ``|r| <= pi/4``), ``COS_COEFS[j] = (-1)**j / (2j)!`` (j = 2..8: to r**16).

Accuracy (tests/arith/test_trig.py, against mpmath): float64 results within a few ulps
for every reduction path; float32 results the correctly rounded value but for rare ties.
"""

from __future__ import annotations

import math

#: the reduction's Cody-Waite range: |x| <= CW_MAX keeps |k| < 2**20
CW_MAX = 2.0**20
#: 2 / pi and pi / 2, rounded to float64
INV_PIO2 = float.fromhex("0x1.45f306dc9c883p-1")
PIO2 = float.fromhex("0x1.921fb54442d18p+0")
#: pi / 2 = P1 + P2 + P3 + P3T: three 33-bit pieces (exact) and the rest, rounded
P1 = float.fromhex("0x1.921fb544p+0")
P2 = float.fromhex("0x1.0b4611a6p-34")
P3 = float.fromhex("0x1.3198a2ep-69")
P3T = float.fromhex("0x1.b839a252049c1p-104")
#: 1.5 * 2**52 and its bits (spec's SHIFT): t = v + SHIFT holds rint(v) in its low bits
SHIFT = 6755399441055744.0
SHIFT_BITS = 0x4338000000000000
#: the first 1152 bits of 2 / pi after the binary point (tests check them against mpmath)
TWO_OVER_PI_HEX = (
    "a2f9836e4e441529fc2757d1f534ddc0db6295993c439041fe5163abdebbc561b7246e3a"
    "424dd2e006492eea09d1921cfe1deb1cb129a73ee88235f52ebb4484e99c7026b45f7e41"
    "3991d639835339f49c845f8bbdf9283b1ff897ffde05980fef2f118b5a0a6d1f6d367ecf"
    "27cb09b74f463f669e5fea2d7527bac7ebe5f17b3d0739f78a5292ea6bfb5fb11f8d5d08"
)
TWO_OVER_PI_BITS = 4 * len(TWO_OVER_PI_HEX)
#: the Payne-Hanek window: 192 bits of 2/pi from bit e - WINDOW_LEAD on (|x| = M 2**e),
#: giving the quadrant and 168 fraction bits
WINDOW_LEAD = 23
WINDOW_BITS = 192
FRACTION_BITS = 168
LIMB = 24
LIMB_MASK = (1 << LIMB) - 1
#: 2/pi in 24-bit limbs behind PAD_LIMBS zero limbs (a window may start up to 55 bits
#: before the binary point, for |x| just above CW_MAX): TWO_OVER_PI_LIMBS[PAD_LIMBS + i]
#: holds bits 24 i + 1 .. 24 i + 24
PAD_LIMBS = 3
TWO_OVER_PI_LIMBS = (0,) * PAD_LIMBS + tuple(
    int(TWO_OVER_PI_HEX[i : i + 6], 16) for i in range(0, len(TWO_OVER_PI_HEX), 6)
)
#: G's limbs and M's
G_LIMBS = WINDOW_BITS // LIMB
M_LIMBS = 3
#: float64 fields
F64_MANT_BITS = 52
F64_EXP_BIAS = 1023
F64_MANT_MASK = (1 << F64_MANT_BITS) - 1
#: the Taylor coefficients, rounded: SIN_COEFS[j] = (-1)**j / (2j+1)!, COS_COEFS[j] =
#: (-1)**j / (2j)! (COS_COEFS[0], [1] and SIN_COEFS[0] unused: the leading terms are exact)
POLY_DEGREE = 8
SIN_COEFS = tuple((-1.0) ** j / math.factorial(2 * j + 1) for j in range(POLY_DEGREE + 1))
COS_COEFS = tuple((-1.0) ** j / math.factorial(2 * j) for j in range(POLY_DEGREE + 1))
