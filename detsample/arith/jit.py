"""The numba kernels of :mod:`detsample.arith.cpu` (this module imports numba; cpu.py
imports it on first use). Each function is the definition of :mod:`detsample.arith.spec`
spelled as scalar code over one element or one row; LLVM vectorises the loops without
changing an operation (no fast-math flags: no contraction, no reassociation).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from detsample.arith import spec

_jit = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)
C = spec.EXP_COEFS
LC = spec.LOG_COEFS
NAN32 = np.array([spec.NAN32_BITS], dtype=np.int32).view(np.float32)[0]
TWO52 = 2.0**52
TWO52_BITS = 0x4330000000000000
EXP_BIAS_SHIFT = spec.SHIFT_BITS - spec.F64_EXP_BIAS
MANT_MASK = (1 << spec.F64_MANT_BITS) - 1
HALF_EXP = (spec.F64_EXP_BIAS - 1) << spec.F64_MANT_BITS


@intrinsic
def bits_of(typingctx, x):  # noqa: ARG001 - numba's intrinsic signature
    """The int64 bit pattern of a float64."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int64))

    return types.int64(types.float64), codegen


@intrinsic
def from_bits(typingctx, x):  # noqa: ARG001
    """The float64 of an int64 bit pattern."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))

    return types.float64(types.int64), codegen


@numba.njit(inline="always", **_jit)
def _exp_clamped(v):
    """exp of a float64 ``v`` in [EXP_LO, EXP_HI], rounded to float32 (the definition
    after its clamp, Estrin's order)."""
    t = v * spec.INV_LN2 + spec.SHIFT
    k = t - spec.SHIFT
    r = (v - k * spec.LN2_HI) - k * spec.LN2_LO
    r2 = r * r
    r4 = r2 * r2
    r8 = r4 * r4
    a0 = C[0] + C[1] * r
    a1 = C[2] + C[3] * r
    a2 = C[4] + C[5] * r
    a3 = C[6] + C[7] * r
    a4 = C[8] + C[9] * r
    a5 = C[10] + C[11] * r
    b0 = a0 + a1 * r2
    b1 = a2 + a3 * r2
    b2 = a4 + a5 * r2
    d0 = b0 + b1 * r4
    d1 = b2 + C[12] * r4
    p = d0 + d1 * r8
    return np.float32(p * from_bits((bits_of(t) - EXP_BIAS_SHIFT) << spec.F64_MANT_BITS))


@numba.njit(inline="always", **_jit)
def exp64(x):
    """exp of a float64, rounded to float32 (the definition, Estrin's order)."""
    v = min(max(x, spec.EXP_LO), spec.EXP_HI)  # min/max, not two ternaries: LLVM makes
    e = _exp_clamped(v)  # selects of these (1.25x faster, measured)
    return NAN32 if x != x else e


@numba.njit(inline="always", **_jit)
def exp64_nonpos(d):
    """:func:`exp64` of a float64 ``d <= 0`` that is not NaN (``d = x - m`` with ``m``
    the finite maximum of ``x``'s row: a normaliser's terms), the same bits: the upper
    clamp and the NaN select cannot act there, so they are left out (a row's normaliser
    9% faster, measured). Any other input is outside its contract."""
    return _exp_clamped(max(d, spec.EXP_LO))


@numba.njit(inline="always", **_jit)
def trunc_word(w):
    """``(trunc(w), w - trunc(w))`` of a float64 ``0 <= w <= 2**52``, the first as an
    int64: the rounding of ``w + 2**52`` then a step back where it rounded up (exact)."""
    t = w + TWO52
    rn = t - TWO52
    up = rn > w
    h = (bits_of(t) - TWO52_BITS) - (1 if up else 0)
    return h, w - (rn - 1.0 if up else rn)


@numba.njit(**_jit)
def log64(x):
    """Natural log of a float64 (the definition)."""
    if not (x > 0.0):
        return -np.inf if x == 0.0 else np.nan
    if x == np.inf:
        return x
    sub = x < spec.F64_MIN_NORMAL
    b = bits_of(x * spec.SUBNORMAL_SCALE if sub else x)
    e = (b >> spec.F64_MANT_BITS) - (spec.F64_EXP_BIAS - 1)
    m = from_bits((b & MANT_MASK) | HALF_EXP)
    if m < spec.SQRT_HALF:
        m = m * 2.0
        e -= 1
    if sub:
        e -= spec.SUBNORMAL_EXP
    f = m - 1.0
    s = f / (f + 2.0)
    w = s * s
    R = LC[10]
    R = R * w + LC[9]
    R = R * w + LC[8]
    R = R * w + LC[7]
    R = R * w + LC[6]
    R = R * w + LC[5]
    R = R * w + LC[4]
    R = R * w + LC[3]
    R = R * w + LC[2]
    R = R * w + LC[1]
    ef = np.float64(e)
    y = (s + s * (w * R)) * 2.0 + ef * spec.LN2_LO
    return ef * spec.LN2_HI + y


@numba.njit(**_jit)
def exp_into(z, out):
    """out[i] = exp64(float64(z[i])): z, out 1-D float32 (out may be z)."""
    for i in range(z.size):
        out[i] = exp64(np.float64(z[i]))


@numba.njit(**_jit)
def exp64_into(x, out):
    """out[i] = exp64(x[i]): x 1-D float64, out 1-D float32."""
    for i in range(x.size):
        out[i] = exp64(x[i])


#: elements of the in-place exp's buffer (64 KB: in L2)
CHUNK = 16384


@numba.njit(**_jit)
def exp_in_place(z):
    """z[i] = exp64(float64(z[i])) of a 1-D float32 array, chunk by chunk through a
    buffer: LLVM vectorises a loop only when its input and output provably do not
    overlap, and an in-place loop over one array takes its scalar path (3x slower,
    measured)."""
    buf = np.empty(CHUNK, dtype=np.float32)
    for s in range(0, z.size, CHUNK):
        m = min(CHUNK, z.size - s)
        part, tmp = z[s : s + m], buf[:m]
        exp_into(part, tmp)
        part[:] = tmp


@numba.njit(**_jit)
def log_into(x, out):
    """out[i] = log64(x[i]): 1-D float64."""
    for i in range(x.size):
        out[i] = log64(x[i])


@numba.njit(inline="always", **_jit)
def max8(row, W, j):
    """The largest of ``row[j + k W]``, k = 0..7, by a fixed tree of selects (an element
    of them; a NaN is never chosen)."""
    a, b, c, d = row[j], row[W + j], row[2 * W + j], row[3 * W + j]
    e, f, g, h = row[4 * W + j], row[5 * W + j], row[6 * W + j], row[7 * W + j]
    a = b if b > a else a
    c = d if d > c else c
    e = f if f > e else e
    g = h if h > g else g
    a = c if c > a else a
    e = g if g > e else e
    return e if e > a else a


@numba.njit(**_jit)
def row_max(x, buf):
    """The maximum of a float32 row, NaN when it holds a NaN (torch's ``amax``): the
    strided groups of 8 reduced elementwise into ``buf`` (a vectorised loop), then
    ``buf`` and the tail."""
    W = x.size // 8
    nan = 0
    for j in range(W):
        buf[j] = max8(x, W, j)
    for i in range(x.size):
        nan |= np.int32(x[i] != x[i])
    m = np.float32(-np.inf)
    for j in range(W):
        m = buf[j] if buf[j] > m else m
    for i in range(8 * W, x.size):
        m = x[i] if x[i] > m else m
    return NAN32 if nan else m


@numba.njit(**_jit)
def row_maxima(x, out, r0, r1):
    """Rows r0..r1 of a (rows, n) float32 ``x``: their :func:`row_max` into ``out``."""
    buf = np.empty(x.shape[1] // 8, dtype=np.float32)
    for r in range(r0, r1):
        out[r] = row_max(x[r], buf)


@numba.njit(**_jit)
def fixed_words(e, frac):
    """The exact int64 words ``(H, L)`` of the definition's two-word sum of a float32
    row ``e`` in [0, 1]: integer sums, so a row's words are the sums of its parts'."""
    scale = 2.0**frac
    H = 0
    L = 0
    for i in range(e.size):
        h, f = trunc_word(np.float64(e[i]) * scale)
        lo, _ = trunc_word(f * scale)
        H += h
        L += lo
    return H, L


@numba.njit(**_jit)
def words_value(H, L, frac):
    """``S = (float64(H) + float64(L) * 2**-frac) * 2**-frac`` of the two words."""
    inv = 1.0 / 2.0**frac
    return (np.float64(H) + np.float64(L) * inv) * inv


@numba.njit(**_jit)
def fixed_sum(e, frac):
    """The definition's exact two-word sum of a float32 row ``e`` in [0, 1] (float64)."""
    H, L = fixed_words(e, frac)
    return words_value(H, L, frac)


@numba.njit(**_jit)
def row_log_norm(x, m, buf, frac):
    """G = log64(S) of a float32 row with finite max ``m``; ``buf``: a float32 scratch
    row (receives the exps)."""
    md = np.float64(m)
    for i in range(x.size):
        buf[i] = exp64_nonpos(np.float64(x[i]) - md)
    return log64(fixed_sum(buf, frac))


@numba.njit(**_jit)
def normalisers(x, m, g_out, frac, r0, r1):
    """Rows r0..r1 of a (rows, n) float32 ``x`` with maxima ``m`` (float32, NaN where
    the row holds a NaN): their log-normaliser G into ``g_out`` (float64; NaN where the
    row's log_softmax is all NaN: a NaN or +inf maximum, or -inf)."""
    buf = np.empty(x.shape[1], dtype=np.float32)
    for r in range(r0, r1):
        ok = (m[r] > -np.inf) & (m[r] < np.inf)
        g_out[r] = row_log_norm(x[r], m[r], buf, frac) if ok else np.nan


@numba.njit(**_jit)
def log_softmax_rows(x, out, frac, r0, r1):
    """Rows r0..r1 of the (rows, n) float32 log_softmax of ``x`` into ``out``."""
    buf = np.empty(x.shape[1], dtype=np.float32)
    for r in range(r0, r1):
        row = x[r]
        o = out[r]
        m = row_max(row, buf)
        if not ((m > -np.inf) & (m < np.inf)):  # a NaN, a +inf or nothing finite
            o[:] = NAN32
            continue
        G = row_log_norm(row, m, buf, frac)
        md = np.float64(m)
        for i in range(row.size):
            o[i] = np.float32((np.float64(row[i]) - md) - G)


@numba.njit(**_jit)
def floored_exp_into(row, floor, out):
    """out[i] = exp64(max(row[i], floor)): 1-D float32 (the vectorised half of a block)."""
    for i in range(row.size):
        v = row[i]
        out[i] = exp64(np.float64(floor if v < floor else v))


@numba.njit(**_jit)
def block_masses(row, e, t, lo, scale, floor, q_row, write):
    """The masses of one block (the integer half): ``trunc(e * scale)`` where ``max(row,
    floor) >= t`` and ``e >= lo``, else 0, into ``q_row`` when ``write``; returns their
    sum."""
    acc = 0
    for i in range(row.size):
        v = row[i]
        v = floor if v < floor else v
        h, _ = trunc_word(np.float64(e[i]) * scale)
        q = h if (v >= t) & (e[i] >= lo) else 0
        if write:
            q_row[i] = q
        acc += q
    return acc


@numba.njit(**_jit)
def cut_masses_rows(z, tau, least, floor, frac, block, q_out, sums, r0, r1):
    """Rows r0..r1 of the fixed-point masses of a (rows, V) float32 ``z`` with per-row
    cuts: ``q = trunc(exp64(v) * 2**frac)`` with ``v = max(z, floor)`` where ``v >=
    tau[r]`` and ``exp64(v) >= least[r]``, else 0; written into ``q_out`` (rows, V) int64
    when it has rows (else not written), and summed by blocks of ``block`` columns into
    ``sums`` (rows, ceil(V / block)) int64 (exact). Each block in two loops, the exps
    into a buffer then the integers: two loops LLVM vectorises (one fused loop it
    vectorised poorly: 1.4x slower, measured)."""
    scale = 2.0**frac
    V = z.shape[1]
    write = q_out.shape[0] > 0
    buf = np.empty(block, dtype=np.float32)
    none = np.empty(0, dtype=np.int64)
    for r in range(r0, r1):
        row = z[r]
        for b in range(sums.shape[1]):
            s = b * block
            e = min(V, s + block)
            floored_exp_into(row[s:e], floor, buf[: e - s])
            q_row = q_out[r, s:e] if write else none
            sums[r, b] = block_masses(row[s:e], buf[: e - s], tau[r], least[r], scale, floor, q_row, write)


@numba.njit(**_jit)
def log_softmax_at_rows(x, ids, out, frac, span):
    """Rows ``span`` = (r0, r1) of a (rows, n) float32 ``x``: the log_softmax value at
    column ``ids[r]`` of each row (int64, in range) into ``out`` (float32): the row's
    :func:`row_max`, :func:`row_log_norm`, then ``float32((x - m) - G)`` (NaN32 for a row
    whose log_softmax is all NaN) -- the bits of :func:`log_softmax_rows` there."""
    r0, r1 = span
    buf = np.empty(x.shape[1], dtype=np.float32)
    for r in range(r0, r1):
        row = x[r]
        out[r] = _log_softmax_at(row, row_max(row, buf), ids[r], buf, frac)


@numba.njit(**_jit)
def _log_softmax_at(row, m, i, buf, frac):
    """The log_softmax of a float32 row with maximum ``m`` at column ``i``: NaN32 when
    ``m`` is not finite, else ``float32((x_i - m) - G)`` (:func:`row_log_norm`)."""
    if not ((m > -np.inf) & (m < np.inf)):  # a NaN, a +inf or nothing finite
        return NAN32
    return pick(row[i], m, row_log_norm(row, m, buf, frac))


@numba.njit(inline="always", **_jit)
def pick(v, m, G):
    """The log_softmax value of an entry ``v`` of a row with maximum ``m`` and
    normaliser ``G``: ``float32((float64(v) - float64(m)) - G)``, NaN32 where ``G`` is
    NaN (``arith.reference.picked``)."""
    return NAN32 if G != G else np.float32((np.float64(v) - np.float64(m)) - G)


@numba.njit(**_jit)
def picked_rows(x, ids, m, g, out):
    """:func:`pick` of each row's entry at ``ids[r]`` of a (rows, n) float32 ``x`` with
    maxima ``m`` and normalisers ``g`` into ``out`` (float32)."""
    for r in range(x.shape[0]):
        out[r] = pick(x[r, ids[r]], m[r], g[r])


@numba.njit(**_jit)
def first_index_of(row, v):
    """The first index of ``v`` in ``row`` (a NaN ``v``: of the first NaN); ``row.size``
    when absent."""
    if v != v:
        for i in range(row.size):
            if row[i] != row[i]:
                return i
        return row.size
    for i in range(row.size):
        if row[i] == v:
            return i
    return row.size


@numba.njit(**_jit)
def greedy_rows(x, out, frac, span):
    """Rows ``span`` = (r0, r1) of a (rows, n) float32 ``x``: each row's argmax (the
    first index of its maximum, of its first NaN when it holds one: numpy's and torch's
    ``argmax``) into ``out[0]`` (int64) and the log_softmax there into ``out[1]``
    (float32; NaN32 for a row whose log_softmax is all NaN) -- the bits of
    :func:`log_softmax_at_rows` at that column, from one maximum pass."""
    tok, lp = out
    r0, r1 = span
    buf = np.empty(x.shape[1], dtype=np.float32)
    for r in range(r0, r1):
        row = x[r]
        m = row_max(row, buf)
        tok[r] = first_index_of(row, m)
        lp[r] = _log_softmax_at(row, m, tok[r], buf, frac)


@numba.njit(**_jit)
def words_part(x, m, frac, out, span):
    """The exact words (H, L) of the two-word sum of ``exp64(x[r, c] - m[r])`` over the
    columns c0..c1 of row r into ``out`` = (H, L) (rows, parts) int64 at [r, p]; ``span``
    = (r, p, c0, c1). Integer sums: a row's words are the sums of its parts' words, so a
    row split over threads has the bits of :func:`row_log_norm`."""
    r, p, c0, c1 = span
    md = np.float64(m[r])
    row = x[r, c0:c1]
    buf = np.empty(c1 - c0, dtype=np.float32)
    for i in range(row.size):
        buf[i] = exp64_nonpos(np.float64(row[i]) - md)
    H, L = fixed_words(buf, frac)
    out[0][r, p] = H
    out[1][r, p] = L


@numba.njit(**_jit)
def log_of_words(H, L, frac):
    """``log64`` of the two words' value: :func:`row_log_norm` of the row they sum."""
    return log64(words_value(H, L, frac))
