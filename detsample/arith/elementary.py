"""The definition of detsample's elementary functions of float64 values: ``exp``,
``expm1``, ``tanh``, ``sigmoid``, ``silu``, ``softplus``, ``gelu`` (both forms),
``sqrt``, ``rsqrt`` and ``pow`` by a scalar -- constants and the sequence of IEEE operations,
written once (``cos`` and ``sin``: :mod:`detsample.arith.trig`; ``log``:
:mod:`detsample.arith.spec`'s ``log64``). Every implementation reproduces it bit for bit:
:mod:`detsample.arith.elementary_jit` (numba, CPU), :mod:`detsample.arith.elementary_torch`
(torch, any device) and ``oracles/elementary.py`` (numpy, written from this text).

Why: the batch-invariant mode's portable kernels (``batch_invariant(portable=True)``)
promise logits whose bits are the same on every CPU; torch's ``exp`` is MKL's vector math
on x86 and Sleef elsewhere, its ``silu`` / ``sigmoid`` / ``gelu`` / ``cos`` / ``sin`` /
``pow`` are ATen's per-ISA kernels (the scalar ``default`` set, AVX2, AVX-512, NEON and
SVE round differently). These are computed from the definitions below instead.

What the bits rest on (as :mod:`detsample.arith.spec`): IEEE-754 binary64 ``+ - * /`` and
``sqrt`` rounded to nearest-even, float64 -> float32 conversion, integer operations and
bit reinterpretation; no fused multiply-add (the kernels are compiled without
contraction), no library call; round-to-nearest and no flush-to-zero in the running
thread. A float32 input enters as its exact float64 value and the float64 result is
rounded ONCE to float32 (bfloat16 / float16: through float32). NaN results are the
canonical quiet NaN of the output type (float64 ``0x7ff8000000000000``, float32
``0x7fc00000``), whatever NaN the platform produced.

**exp** (``float32(exp(x)) == spec.exp64(x)`` for every float32 ``x``)::

    v = min(max(x, EXP_LO), EXP_HI)                 # exp(EXP_LO) < 2**-1075: 0; exp(EXP_HI): inf
    t = v * INV_LN2 + SHIFT;  k = t - SHIFT          # k = rint(v / ln 2), k in [-1077, 1025]
    r = (v - k * LN2_HI) - k * LN2_LO
    p = the Estrin polynomial of spec (EXP_COEFS, the same order)
    k1 = k >> 1 (floor);  k2 = k - k1                # 2**k1, 2**k2 normal
    y = (p * 2**k1) * 2**k2                          # the first product exact, the second rounds once

Within ~3 ulps of ``e**x`` (the polynomial's 4e-16 relative, as spec's).

**expm1** (no cancellation near 0)::

    x == 0: x (keeps -0)
    v = min(max(x, EXPM1_LO), EXP_HI);  t, k, r as for exp
    q = r + (r * r) * D(r)                           # D: Estrin over EXPM1_COEFS[j] = 1/(j+2)!,
                                                     # j = 0..12, the order of exp's polynomial
    k == 0: y = q
    else:   y = 2 * ((q * 2**(k-1)) + (2**(k-1) - 0.5))   # 2**k (1 + q) - 1, one rounded sum

``e**v - 1 = 2**k (e**r - 1) + (2**k - 1)``: ``q`` carries ``r``'s bits exactly, the scaled
terms are exact (``2**(k-1) - 0.5`` for k - 1 >= -54), so one addition rounds. Within ~2
ulps. ``expm1(v)`` for ``v <= EXPM1_LO`` is -1 in float64.

**tanh**::

    s = min(|x|, TANH_BIG);  t = expm1(2 * s);  y = copysign(t / (t + 2), x)

``tanh(TANH_BIG)`` is 1 in float64. Within ~3 ulps.

**sigmoid**, **silu**::

    sigmoid(x) = 1 / (1 + exp(-x))      silu(x) = x / (1 + exp(-x))

(``silu(-inf)`` is NaN, as torch's.) Within ~4 ulps. Where ``exp(-x)`` overflows (``x <
-709.78``) these and gelu's tanh form give 0 for a float64 result that would be below
~1e-305; float32 results are 0 there anyway.

**softplus** (torch's ``softplus(x, beta, threshold)``)::

    z = x * beta
    z > threshold: y = x
    else: u = exp(z);  w = 1 + u
          l = u if (w == 1 or u == inf) else log64(w) * (u / (w - 1))   # log1p(u), no cancellation
          y = l / beta

``log64`` is :mod:`detsample.arith.spec`'s. Within ~4 ulps.

**gelu**, ``approximate="tanh"`` (torch's formula ``0.5 x (1 + tanh(y))`` written as
``x sigmoid(2 y)``, the same function without the cancellation of ``1 + tanh(y)`` for
negative ``x``)::

    y = SQRT_2_OVER_PI * (x + GELU_KAPPA * ((x * x) * x));   g = x / (1 + exp(-2 * y))

**gelu**, ``approximate="none"``: ``x Phi(x)``, ``Phi`` the standard normal CDF, from its
series, the Taylor series of Mills' ratio ``M(a) = Phi(-a) / phi(a)`` and Laplace's
continued fraction (the coefficients are exact expressions, rounded once)::

    a = |x|;  phi(v) = exp(-(v * v) * 0.5) * INV_SQRT_2PI
    a <= PHI_SERIES_MAX:  P = 0.5 + phi(x) * (x * estrin(PHI_SERIES, x * x))
    a <= MILLS_MAX:       Q = phi(a) * estrin(MILLS_COEFS, a - MILLS_CENTER)
    else:                 t = a;  t = a + k / t  for k = PHI_CF_TERMS .. 1;  Q = phi(a) / t
    (a > PHI_SERIES_MAX)  P = Q if x < 0 else 1 - Q
    g = x * P

    estrin(c, p):  while c has more than one entry:                # Estrin's scheme
                       c = [c[2j] + c[2j+1] * p for each pair] (+ an unpaired last entry as is)
                       p = p * p
                   the one entry left

``PHI_SERIES[n] = 1 / (1 3 5 ... (2n+1))`` (``Phi(x) = 1/2 + phi(x) sum x**(2n+1) / (2n+1)!!``,
every term of one sign), ``MILLS_COEFS[n] = M^(n)(3) / n!`` (from ``M' = a M - 1``:
``M^(n+1) = a M^(n) + n M^(n-1)``), n = 0..24. Truncation below 3e-16 relative on each
piece. The series' ``1/2 + ...`` for ``x`` in ``[-2, 0)`` cancels up to ``0.5 / Phi(-2) ~ 22``
times, so a float64 result is within ~7e-15 relative of ``x Phi(x)`` there (and the tail's
``exp(-x**2 / 2)`` magnifies the rounding of ``x**2``: ~``x**2`` ulps).

**sqrt**: the IEEE square root (correctly rounded; not torch's CPU ``sqrt``, which is MKL's
vector math and 1 ulp off for ~1% of float64 and ~15% of float32 inputs, measured).
**rsqrt**: ``1 / sqrt(x)`` (two IEEE operations).

**pow** by a scalar exponent ``e`` (torch's ``pow.Tensor_Scalar``), by :func:`pow_kind`::

    e == 0.5: sqrt(x);  e == -0.5: rsqrt(x)
    e an integer, |e| < POW_INT_MAX:  y = 1;  b = x;  n = |e|
                                      while n:  (n odd: y = y * b);  n = n >> 1;  (n: b = b * b)
                                      e < 0: y = 1 / y
    otherwise:  m = |x|
                a = +0 (e > 0) or +inf (e < 0)    where m == 0
                  = +inf (e > 0) or +0 (e < 0)    where m == inf
                  = exp(e * log64(m))             elsewhere
                y = a for x >= 0; for x < 0: -a (e an odd integer), a (e an even integer),
                    NaN (e not an integer, x finite), a (x = -inf); NaN for a NaN x or e

``pow(x, 0)`` is 1 and ``pow(x, 2)`` is ``x * x`` rounded once; an integer power is within
~log2(e) ulps; the general case within ~``|e log x|`` ulps (``e log x`` is rounded before
``exp`` magnifies its error): ~1e-14 relative for the exponents models use, far inside a
float32 ulp.
"""

from __future__ import annotations

import math

from detsample.arith import spec

#: exp's clamp in float64: exp(EXP_LO) < 2**-1075 rounds to 0, exp(EXP_HI) overflows
EXP_LO = -746.0
EXP_HI = 710.0
#: expm1's lower clamp: expm1(x) rounds to -1 in float64 from here down (e**-45 < 2**-54)
EXPM1_LO = -45.0
#: the Taylor coefficients of (e**r - 1 - r) / r**2: EXPM1_COEFS[j] = 1 / (j + 2)!, rounded
EXPM1_COEFS = tuple(1.0 / math.factorial(j + 2) for j in range(spec.EXP_DEGREE + 1))
#: tanh's clamp: tanh(20) rounds to 1 in float64
TANH_BIG = 20.0
#: sqrt(2 / pi) and 1 / sqrt(2 pi), rounded to float64 (tests check them against mpmath)
SQRT_2_OVER_PI = float.fromhex("0x1.9884533d43651p-1")
INV_SQRT_2PI = float.fromhex("0x1.9884533d43651p-2")
#: the cubic coefficient of gelu's tanh form (torch's kKappa), as float64
GELU_KAPPA = 0.044715
#: Phi(x): its series for |x| <= PHI_SERIES_MAX, Mills' ratio's Taylor series about
#: MILLS_CENTER up to MILLS_MAX, the continued fraction (PHI_CF_TERMS levels) beyond
PHI_SERIES_MAX = 2.0
MILLS_CENTER = 3.0
MILLS_MAX = 4.0
PHI_CF_TERMS = 40
PHI_DEGREE = 24
#: PHI_SERIES[n] = 1 / (2n+1)!!, rounded
PHI_SERIES = tuple(1.0 / math.prod(range(1, 2 * n + 2, 2)) for n in range(PHI_DEGREE + 1))
#: MILLS_COEFS[n] = M^(n)(3) / n!, M(a) = Phi(-a) / phi(a), rounded (tests/arith derive
#: them with mpmath)
MILLS_COEFS = tuple(
    float.fromhex(h)
    for h in (
        "0x1.37e684ee8e185p-2",
        "-0x1.6131c4d156dc3p-4",
        "0x1.78098a8c67997p-6",
        "-0x1.7b8def8030db5p-8",
        "0x1.6d7c5bb10bd3cp-10",
        "-0x1.516888be198e5p-12",
        "0x1.2bcfe30697181p-14",
        "-0x1.01416a398089ep-16",
        "0x1.ab7b4d6ddac29p-19",
        "-0x1.58b5f601171fap-21",
        "0x1.0e5154ae7577cp-23",
        "-0x1.9d02cd122bb3dp-26",
        "0x1.33d614bf0d8b9p-28",
        "-0x1.c05448a4a1567p-31",
        "0x1.3f57f12794abcp-33",
        "-0x1.bd7c6e75371d2p-36",
        "0x1.30928f774001ap-38",
        "-0x1.9893c9253a8efp-41",
        "0x1.0d13ce496731cp-43",
        "-0x1.5c3e33404c104p-46",
        "0x1.bb27f03755589p-49",
        "-0x1.156c87e0d56c4p-51",
        "0x1.55f23d89c1dc4p-54",
        "-0x1.9f26187db41adp-57",
        "0x1.f0b53646fb85dp-60",
    )
)
#: pow by an integer exponent runs the square-and-multiply loop below this magnitude
POW_INT_MAX = 2**31
#: float64 NaN's canonical bits
NAN64_BITS = 0x7FF8000000000000

GELU_FORMS = ("none", "tanh")


def pow_kind(exponent: float) -> int:
    """How :func:`pow` treats a scalar exponent: 0 the general case, 1 the
    square-and-multiply loop (an integer of magnitude below :data:`POW_INT_MAX`), 2
    ``sqrt``, 3 ``rsqrt``. ValueError names a non-real exponent."""
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        raise ValueError(f"pow's exponent must be a real number, got {exponent!r}")
    e = float(exponent)
    if e == 0.5:
        return 2
    if e == -0.5:
        return 3
    if e.is_integer() and abs(e) < POW_INT_MAX:
        return 1
    return 0


def is_odd_integer(e: float) -> bool:
    """Whether ``e`` is an odd integer (float64: every float beyond 2**53 is even)."""
    return math.isfinite(e) and e.is_integer() and abs(e) < 2.0**53 and int(e) % 2 == 1


def check_gelu_form(approximate: str) -> None:
    """ValueError naming ``approximate`` unless it is one of :data:`GELU_FORMS`."""
    if approximate not in GELU_FORMS:
        raise ValueError(f"gelu's approximate must be one of {GELU_FORMS}, got {approximate!r}")
