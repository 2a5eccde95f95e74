"""The definition of detsample's own ``exp``, ``log`` and exact sums: constants and the
sequence of IEEE operations, written once; every implementation reproduces it.

Why: torch's ``exp`` / ``log`` are MKL's vector math on x86 (bits follow MKL's code path),
Sleef elsewhere (bits follow the vector width and the build), and a float sum's bits
follow its order. Every float the sampler outputs or decides on is computed from the
functions below instead, so for the same logits the sampler gives one set of bits on
every CPU, ISA, MKL path, thread count and torch build. Implementations, held to each
other bit for bit by tests/arith: :mod:`detsample.arith.reference` (torch, any device),
:mod:`detsample.arith.cpu` (numba, the CPU's fast form), ``oracles/arith.py`` (numpy,
written independently from this text) and the Triton helpers in
:mod:`detsample.kernels.common`.

What the bits rest on: only IEEE-754 binary64 / binary32 operations that every platform
rounds the same way -- ``+ - * /`` rounded to nearest-even, conversions float32 <->
float64 (rounded to nearest-even, subnormals kept), truncation to integers, integer
``+ - << >>`` and bit reinterpretation. No fused multiply-add (each product is rounded
before the sum: the kernels are compiled without contraction), no library call, no
order-dependent float sum. Assumed of the running thread: round-to-nearest and no
flush-to-zero of subnormals (the defaults; ``torch.set_flush_denormal(True)`` would break
it, and :func:`detsample.arith.check_environment` refuses it).

**exp** (float64 ``x`` -> float32), :func:`exp64` in each implementation (the sampler's
float32 ``z`` enter as ``float64(z)``, exact)::

    x = min(max(x, EXP_LO), EXP_HI)              # exp(EXP_LO) < 2**-150: 0 in float32,
                                                 # exp(EXP_HI) > float32 max: inf
    t = x * INV_LN2 + SHIFT                      # SHIFT = 1.5 * 2**52: t holds rint(x / ln 2)
    k = t - SHIFT                                # an integer in [-150, 129]
    r = (x - k * LN2_HI) - k * LN2_LO            # Cody-Waite: k * LN2_HI is exact
    r2 = r * r;  r4 = r2 * r2;  r8 = r4 * r4     # Estrin's scheme, C[j] = EXP_COEFS[j] = 1/j!:
    a_j = C[2j] + C[2j+1] * r        (j = 0..5)
    b0 = a0 + a1 * r2;  b1 = a2 + a3 * r2;  b2 = a4 + a5 * r2
    d0 = b0 + b1 * r4;  d1 = b2 + C[12] * r4
    p = d0 + d1 * r8
    e = float32(p * 2**k)                        # 2**k from bits ((k + 1023) << 52); the
                                                 # product is exact, the cast rounds once
    NaN -> NaN32 (the canonical quiet NaN, 0x7fc00000)

Accuracy: the float64 ``p * 2**k`` is within ~4e-16 relative of ``e**x`` (Taylor to degree
12 on |r| <= ln2/2 leaves < 2.5e-16), so the float32 result is the correctly rounded one
except when ``e**x`` lies within that distance of a float32 rounding boundary (about 1
input in 10^8; then 1 ulp off). ``exp64(0) == 1`` exactly. (Estrin, not Horner: the same
accuracy, and independent products a vector unit overlaps: 1.45x faster in numba.)

**log** (float64 ``x`` -> float64), :func:`log64`::

    x = m * 2**e with m in [sqrt(1/2), sqrt(2)), from the bits (subnormals scaled by 2**54)
    f = m - 1;  s = f / (2 + f);  w = s * s      # log(m) = 2 atanh(s)
    R = LOG_COEFS[10]; R = R * w + LOG_COEFS[j] for j = 9 .. 1   # 1/(2j+1)
    y = e * LN2_HI + ((s + s * (w * R)) * 2 + e * LN2_LO)
    NaN or x < 0 -> NaN; 0 -> -inf; inf -> inf

Accuracy: within a few float64 ulps. It is called once per row (the normaliser), so its
cost never matters.

**sums**: a row's ``sum_i exp32(d_i)`` is taken in two-word fixed point, exact and so
independent of any order: with ``F = frac_bits(n)``, each ``w_i = float64(e_i) * 2**F``
splits into ``h_i = trunc(w_i)`` and ``l_i = trunc((w_i - h_i) * 2**F)`` (both exact),
``H = sum h_i`` and ``L = sum l_i`` are exact int64 sums (``n * 2**F <= 2**62``), and
``S = (float64(H) + float64(L) * 2**-F) * 2**-F``. ``h_i`` is the sampler's mass ``q_i``
of the same ``e_i``; the pair keeps every term down to ``2**-2F``.

**log_softmax** (a float32 row ``x`` of length n -> float32)::

    m = max_i x_i                               # a row with a NaN or +inf, or without a
                                                # finite value: every entry NaN32
    d_i = float64(x_i) - float64(m)             # float64: exact for any realistic row
    e_i = exp64(d_i);  S from e_i as above;  G = log64(S)
    y_i = float32(d_i - G)                      # -inf where x_i = -inf

Its accuracy: within 1 ulp of the float64 log_softmax rounded to float32 (measured:
0.06% of entries 1 ulp off on sigma-3 rows of 152,064, none further), where torch's float32 kernel is
up to hundreds of ulps off near 0.
"""

from __future__ import annotations

import math

#: the fraction bits of a fixed-point mass: ``n * 2**F <= 2**MASS_BITS`` (exact int64
#: sums of n masses), ``F <= MAX_FRAC``
MASS_BITS = 62
MAX_FRAC = 52

#: exp's clamp: exp(EXP_LO) < 2**-150 rounds to 0 in float32, exp(EXP_HI) overflows it
EXP_LO = -104.0
EXP_HI = 89.0
#: 1 / ln 2, rounded to float64
INV_LN2 = float.fromhex("0x1.71547652b82fep+0")
#: ln 2 in two parts (fdlibm's): LN2_HI has 32 significant bits, so k * LN2_HI is exact
#: for |k| < 2**21; LN2_LO = ln 2 - LN2_HI rounded
LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
#: 1.5 * 2**52: adding it rounds a float64 of magnitude < 2**51 to an integer (ties to
#: even), which its low mantissa bits then hold
SHIFT = 6755399441055744.0
#: the bits of SHIFT (``t``'s bits minus these are ``k``)
SHIFT_BITS = 0x4338000000000000
#: Taylor coefficients of exp: EXP_COEFS[j] = 1 / j!, each the float64 nearest
EXP_DEGREE = 12
EXP_COEFS = tuple(1.0 / math.factorial(j) for j in range(EXP_DEGREE + 1))

#: atanh series of log: LOG_COEFS[j] = 1 / (2j + 1), j = 0 .. LOG_TERMS (j = 0 unused)
LOG_TERMS = 10
LOG_COEFS = tuple(1.0 / (2 * j + 1) for j in range(LOG_TERMS + 1))
SQRT_HALF = float.fromhex("0x1.6a09e667f3bcdp-1")
#: float64 bit fields
F64_EXP_BIAS = 1023
F64_MANT_BITS = 52
#: 2**54 and its exponent, to normalise a subnormal float64 before reading its bits
SUBNORMAL_SCALE = 2.0**54
SUBNORMAL_EXP = 54
F64_MIN_NORMAL = 2.0**-1022

#: the canonical quiet NaN of float32 (x86's default NaN has the sign bit set, aarch64's
#: not: every NaN detsample outputs is this one)
NAN32_BITS = 0x7FC00000


def frac_bits(n: int) -> int:
    """Fixed-point fraction bits ``F`` so that ``n * 2**F <= 2**62`` (F <= 52): a sum of
    n terms of at most ``2**F`` each is an exact int64."""
    return min(MAX_FRAC, MASS_BITS - max(1, math.ceil(math.log2(max(n, 2)))))
