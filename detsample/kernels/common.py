"""Shared pieces of the Triton kernels: block sizes, device checks, jit helpers.

The sampling rules' constants come from :mod:`detsample.rules`; the formulas a kernel
needs are spelled here once each as ``@triton.jit`` helpers (the Triton spelling of the
rule of the same name there), and tests/kernels/test_rules.py runs them on the table
that tests/test_rules.py runs the Python spellings on.

detsample's own arithmetic (:mod:`detsample.arith.spec`: ``exp``, ``log``, the exact
two-word sums) is spelled here too, operation by operation, from the spec's constants:
:func:`exp64` / :func:`exp32` (and :func:`exp64_wide`), :func:`log64`, :func:`fixed_words` and
:func:`fixed_value`. Every ``exp`` or ``log`` whose result reaches a sampler output or
decision is one of these, never ``tl.exp`` / ``tl.log`` / ``tl.math`` (the GPU's
approximate ``ex2`` / ``lg2``, the interpreter's numpy): only IEEE ``+ - * /`` on
float64 / float32, conversions, integer operations, bit reinterpretations and selects,
launched without contraction (:data:`OPTS`), so a GPU and the interpreter compute
detsample.arith's bits (tests/kernels/test_arith.py; the PTX is checked for
contractions and approximate instructions by tests/kernels/test_compile.py).

Block sizes are functions of the row length only (never of the batch size), and every
launch uses the same ``num_warps``, so the order of each in-row reduction is fixed by
the row length alone: a row gives the same bits in any batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from detsample import rules
from detsample.arith import spec

#: elements per block of the row-streaming kernels (a reduction tree of this width)
ROW_BLOCK = 1024
#: warps of every row kernel (part of the reduction order: never tuned per batch)
NUM_WARPS = 4
#: launch options of the row kernels: fixed warps, and no FMA contraction (explicit, so
#: the bits do not follow Triton's default, which changes in Triton 3.10)
OPTS = {"num_warps": NUM_WARPS, "enable_fp_fusion": False}

NAN_FLOOR: tl.constexpr = tl.constexpr(rules.NAN_FLOOR)
POSINF_CEIL: tl.constexpr = tl.constexpr(rules.POSINF_CEIL)
#: larger than any token id (padding of id buffers)
PAD_ID: tl.constexpr = tl.constexpr(rules.PAD_ID)
STATUS_HAD_NAN: tl.constexpr = tl.constexpr(rules.STATUS_HAD_NAN)
STATUS_HAD_POSINF: tl.constexpr = tl.constexpr(rules.STATUS_HAD_POSINF)
STATUS_NO_VALID_TOKEN: tl.constexpr = tl.constexpr(rules.STATUS_NO_VALID_TOKEN)
U_SCALE: tl.constexpr = tl.constexpr(rules.U_SCALE)

# -- detsample.arith.spec's constants (each float materialised as a float64 by _f64) --
EXP_LO: tl.constexpr = tl.constexpr(spec.EXP_LO)
EXP_HI: tl.constexpr = tl.constexpr(spec.EXP_HI)
INV_LN2: tl.constexpr = tl.constexpr(spec.INV_LN2)
LN2_HI: tl.constexpr = tl.constexpr(spec.LN2_HI)
LN2_LO: tl.constexpr = tl.constexpr(spec.LN2_LO)
SHIFT: tl.constexpr = tl.constexpr(spec.SHIFT)
#: ``t``'s bits minus this, shifted left by 52, are the bits of ``2**k``
EXP_BIAS_SHIFT: tl.constexpr = tl.constexpr(spec.SHIFT_BITS - spec.F64_EXP_BIAS)
MANT_BITS: tl.constexpr = tl.constexpr(spec.F64_MANT_BITS)
MANT_MASK: tl.constexpr = tl.constexpr((1 << spec.F64_MANT_BITS) - 1)
#: the exponent field of a float64 in [1/2, 1), and the exponent that field stands for
HALF_EXP_BITS: tl.constexpr = tl.constexpr((spec.F64_EXP_BIAS - 1) << spec.F64_MANT_BITS)
HALF_EXP: tl.constexpr = tl.constexpr(spec.F64_EXP_BIAS - 1)
SQRT_HALF: tl.constexpr = tl.constexpr(spec.SQRT_HALF)
SUBNORMAL_SCALE: tl.constexpr = tl.constexpr(spec.SUBNORMAL_SCALE)
SUBNORMAL_EXP: tl.constexpr = tl.constexpr(spec.SUBNORMAL_EXP)
F64_MIN_NORMAL: tl.constexpr = tl.constexpr(spec.F64_MIN_NORMAL)
NAN32_BITS: tl.constexpr = tl.constexpr(spec.NAN32_BITS)
#: the float64 NaN of log64 and a NaN row's normaliser (numpy's / torch's ``nan``)
NAN64_BITS: tl.constexpr = tl.constexpr(0x7FF8000000000000)
#: exp's Taylor coefficients 1/j!, j = 0..12, and log's atanh series 1/(2j+1), j = 0..10
#: (the spec's tuples; the helpers index them with constants)
EXP_COEFS: tl.constexpr = tl.constexpr(spec.EXP_COEFS)
LOG_COEFS: tl.constexpr = tl.constexpr(spec.LOG_COEFS)
LOG_TERMS: tl.constexpr = tl.constexpr(spec.LOG_TERMS)


def row_block(n: int) -> int:
    """Block width for rows of length ``n``: ``min(ROW_BLOCK, next_pow2(n))``."""
    return min(ROW_BLOCK, triton.next_power_of_2(max(int(n), 1)))


def interpreted() -> bool:
    """True when this process's kernels run under the Triton interpreter (they were
    decorated with ``TRITON_INTERPRET=1``); read from the decorated kernel's type, not
    from the environment."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(fq_mass, InterpretedFunction)


def check_device(device: torch.device) -> None:
    """Raise ValueError unless kernels can run on tensors of ``device``: CUDA (compiled)
    or CPU under the interpreter."""
    if device.type == "cuda":
        return
    if device.type == "cpu" and interpreted():
        return
    raise ValueError(
        f"Triton kernels need CUDA tensors, or CPU tensors under the Triton interpreter "
        f"(TRITON_INTERPRET=1 set before triton is imported); got device {device.type!r}"
    )


@triton.jit
def fq_mass(e, FRAC: tl.constexpr):
    """:func:`detsample.rules.mass`: ``trunc(e * 2**FRAC)`` of float32 ``e`` in [0, 1]."""
    return (e * (2.0**FRAC)).to(tl.int64)


@triton.jit
def top_p_limit(top_p, total):
    """:func:`detsample.rules.top_p_limit`: ``top_p * float64(Z)``, ``+inf`` at top_p >= 1."""
    return tl.where(top_p >= 1.0, float("inf"), top_p * total.to(tl.float64))


@triton.jit
def top_p_keeps(above, limit):
    """:func:`detsample.rules.top_p_keeps`: ``float64(above) < limit``."""
    return above.to(tl.float64) < limit


@triton.jit
def min_p_keeps(e, min_p):
    """:func:`detsample.rules.min_p_keeps`: ``exp(z) >= min_p``."""
    return e >= min_p


#: the element-wise filters :func:`element_keeps` spells, in its column order: the names of
#: :data:`detsample.rules.ELEMENT_FILTERS` (tests/kernels/test_rules.py holds the two equal;
#: the kernels refuse a registry they do not spell)
ELEMENT_FILTERS = ("min_p",)


@triton.jit
def element_keeps(e, params):
    """:func:`detsample.rules.element_keeps` of one row: whether every element-wise filter
    keeps ``e = exp(z)``; ``params`` points at the row's (F,) float32 parameters, column j
    of filter j of :data:`ELEMENT_FILTERS` (a new filter: its test ANDed here, reading
    ``params + j``)."""
    return min_p_keeps(e, tl.load(params))


@triton.jit
def draw_target(u, total):
    """:func:`detsample.rules.draw_target`: ``min(floor(u * float64(Q)), Q - 1)``."""
    return tl.minimum(tl.floor(u * total.to(tl.float64)).to(tl.int64), total - 1)


@triton.jit
def first_above(csum, t):
    """:func:`detsample.rules.first_above`: the count of running masses ``<= t``."""
    return tl.sum((csum <= t).to(tl.int32), 0)


@triton.jit
def uniform(w0, w1):
    """:func:`detsample.rules.uniform` of :func:`detsample.rules.u52`: ``(n + 0.5) *
    2**-52`` of the 52 bits ``(w0 << 20) | (w1 >> 12)`` of two uint32 Philox words."""
    n = (w0.to(tl.uint64) << 20) | (w1.to(tl.uint64) >> 12)
    return (n.to(tl.float64) + 0.5) * U_SCALE


@triton.jit
def order_key(z):
    """Order-preserving uint32 key of non-NaN float32 values (-0.0 keyed as +0.0, so
    the two zeros tie, as they do under ``>=``)."""
    z = tl.where(z == 0.0, 0.0, z)
    b = z.to(tl.uint32, bitcast=True)
    return tl.where((b >> 31) == 1, ~b, b | 0x80000000)


# -- detsample.arith: exp, log, the exact two-word sums ----------------------------------


@triton.jit
def _f64(c: tl.constexpr):
    """The float64 constant ``c`` (a 0-d float64 tensor: the exact double, whatever
    Triton's typing of a Python float scalar, which rounds to float32 in some versions)."""
    return tl.full((), c, tl.float64)


@triton.jit
def nan32():
    """The canonical float32 NaN of detsample's outputs (bits 0x7fc00000), 0-d."""
    return tl.full((), NAN32_BITS, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def nan64():
    """The float64 NaN (bits 0x7ff8000000000000) of :func:`log64` and a NaN row's
    normaliser, 0-d."""
    return tl.full((), NAN64_BITS, tl.int64).to(tl.float64, bitcast=True)


@triton.jit
def exp64(x):
    """:func:`detsample.arith.exp64`: float64 ``x`` (any shape) -> float32 ``exp(x)``,
    the definition's sequence of IEEE operations (:mod:`detsample.arith.spec`): clamp to
    [EXP_LO, EXP_HI], ``k = rint(x / ln 2)`` by the shift constant, Cody-Waite ``r``,
    the degree-12 Taylor polynomial in Estrin's order, times ``2**k`` built from ``k``'s
    bits (exact) -- :func:`exp64_wide` -- rounded once to float32; NaN -> NaN32. Bit for
    bit arith's on any device that rounds float64 ``+ - *`` and the float64 -> float32
    conversion as IEEE (no contraction: :data:`OPTS`)."""
    return tl.where(x != x, nan32(), exp64_wide(x).to(tl.float32))


@triton.jit
def exp64_wide(x):
    """The float64 ``p * 2**k`` that :func:`exp64` rounds once to float32 (same shape
    as ``x``; NaN where ``x`` is NaN). Exposed so tests hold the polynomial's order to
    the definition in float64, where a change of order shows (in float32 it shows for
    about 1 input in 10^8)."""
    v = tl.minimum(tl.maximum(x, _f64(EXP_LO)), _f64(EXP_HI))
    t = v * _f64(INV_LN2) + _f64(SHIFT)
    k = t - _f64(SHIFT)
    r = (v - k * _f64(LN2_HI)) - k * _f64(LN2_LO)
    r2 = r * r
    r4 = r2 * r2
    r8 = r4 * r4
    a0 = _f64(EXP_COEFS[0]) + _f64(EXP_COEFS[1]) * r
    a1 = _f64(EXP_COEFS[2]) + _f64(EXP_COEFS[3]) * r
    a2 = _f64(EXP_COEFS[4]) + _f64(EXP_COEFS[5]) * r
    a3 = _f64(EXP_COEFS[6]) + _f64(EXP_COEFS[7]) * r
    a4 = _f64(EXP_COEFS[8]) + _f64(EXP_COEFS[9]) * r
    a5 = _f64(EXP_COEFS[10]) + _f64(EXP_COEFS[11]) * r
    b0 = a0 + a1 * r2
    b1 = a2 + a3 * r2
    b2 = a4 + a5 * r2
    d0 = b0 + b1 * r4
    d1 = b2 + _f64(EXP_COEFS[12]) * r4
    p = d0 + d1 * r8
    two_k = ((t.to(tl.int64, bitcast=True) - EXP_BIAS_SHIFT) << MANT_BITS).to(tl.float64, bitcast=True)
    return p * two_k


@triton.jit
def exp32(z):
    """:func:`detsample.arith.exp`: float32 ``z`` -> float32, :func:`exp64` of the
    (exact) ``float64(z)``. The ``exp`` of every mass, min-p test and logprob."""
    return exp64(z.to(tl.float64))


@triton.jit
def log64(x):
    """:func:`detsample.arith.log64`: float64 ``x`` (any shape) -> float64 ``log(x)``,
    the definition's operations: ``x = m * 2**e`` from the bits (subnormals scaled by
    2**54 first), ``m`` in [sqrt(1/2), sqrt(2)), ``s = f / (2 + f)``, the atanh series
    by Horner in ``s * s`` (LOG_COEFS[10] .. [1]), ``e * LN2_HI + ((s + s * (w * R)) * 2
    + e * LN2_LO)``. NaN or ``x < 0`` -> NaN (bits 0x7ff8000000000000); ``+-0`` ->
    ``-inf``; ``+inf`` -> ``+inf``."""
    ok = (x > 0.0) & (x < float("inf"))
    v = tl.where(ok, x, _f64(1.0))
    sub = v < _f64(F64_MIN_NORMAL)
    v = tl.where(sub, v * _f64(SUBNORMAL_SCALE), v)
    b = v.to(tl.int64, bitcast=True)
    e = (b >> MANT_BITS) - HALF_EXP
    m = ((b & MANT_MASK) | HALF_EXP_BITS).to(tl.float64, bitcast=True)
    low = m < _f64(SQRT_HALF)
    m = tl.where(low, m * _f64(2.0), m)
    e = e - low.to(tl.int64) - sub.to(tl.int64) * SUBNORMAL_EXP
    f = m - _f64(1.0)
    s = f / (f + _f64(2.0))
    w = s * s
    R = _f64(LOG_COEFS[LOG_TERMS])
    for j in tl.static_range(LOG_TERMS - 1, 0, -1):
        R = R * w + _f64(LOG_COEFS[j])
    ef = e.to(tl.float64)
    y = (s + s * (w * R)) * _f64(2.0) + ef * _f64(LN2_LO)
    y = ef * _f64(LN2_HI) + y
    fill = tl.where(x == 0.0, float("-inf"), tl.where(x == float("inf"), float("inf"), nan64()))
    return tl.where(ok, y, fill)


@triton.jit
def fixed_words(e, FRAC: tl.constexpr):
    """The two fixed-point words of float32 ``e`` in [0, 1] (arith.spec "sums"):
    ``w = float64(e) * 2**FRAC``, ``h = trunc(w)`` and ``l = trunc((w - h) * 2**FRAC)``,
    both int64 and exact (``h`` is :func:`fq_mass`, the sampler's mass ``q``). A row's
    ``H = sum h`` and ``L = sum l`` are exact int64 sums (``n * 2**FRAC <= 2**62``), so
    any reduction order, block size or tree gives the same pair."""
    scale = _f64(2.0**FRAC)
    w = e.to(tl.float64) * scale
    h = w.to(tl.int64)
    lo = ((w - h.to(tl.float64)) * scale).to(tl.int64)
    return h, lo


@triton.jit
def fixed_value(H, L, FRAC: tl.constexpr):
    """The float64 value ``S = (float64(H) + float64(L) * 2**-FRAC) * 2**-FRAC`` of a
    row's exact two-word sum (int64 ``H``, ``L`` of :func:`fixed_words`)."""
    inv = _f64(1.0 / 2.0**FRAC)
    return (H.to(tl.float64) + L.to(tl.float64) * inv) * inv
