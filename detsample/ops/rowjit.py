"""numba kernels of the sampler's full-row CPU passes (:mod:`detsample.ops.rowpass`
imports this module on first use; it imports numba).

Each kernel is the torch composition it replaces spelled as loops over one row, with
detsample's exp (:mod:`detsample.arith.jit`), compiled without fast-math (every IEEE
operation as written); each row's result depends on that row alone. Loops are split so
that LLVM vectorises each (elementwise work into a buffer, then the integer sums).
"""

from __future__ import annotations

import numba
import numpy as np

from detsample.arith.jit import block_masses, floored_exp_into, max8, row_log_norm, trunc_word

_jit = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)


@numba.njit(**_jit)
def _scale_row(xr, mr, tr, zr):
    """``zr = float32(float32(xr - mr) / tr)`` (float32: a subtraction, then a true
    division, each rounded once: ``ops.temperature.scale_logits``)."""
    for i in range(xr.size):
        zr[i] = (xr[i] - mr) / tr


@numba.njit(**_jit)
def scale_rows(x, m, t, z, r0, r1):
    """Rows r0..r1 of :func:`_scale_row`."""
    for r in range(r0, r1):
        _scale_row(x[r], m[r], t[r], z[r])


@numba.njit(**_jit)
def _group_maxima(row, out):
    """``out`` = the maxima of ``row``'s strided column groups of 8 (``ops.nucleus``),
    the last ``V % 8`` columns as they are (one vectorised loop over the groups)."""
    W = row.size // 8
    for j in range(W):
        out[j] = max8(row, W, j)
    for j in range(8 * W, row.size):
        out[W + j - 8 * W] = row[j]


@numba.njit(**_jit)
def mass_and_maxima_rows(z, thr, consts, out, span):
    """Rows ``span`` = (r0, r1) of a (rows, V) float32 ``z``: the exact mass of the
    survivors ``max(z, floor) >= thr[r]`` into ``totals`` (int64), and the maxima of the
    strided groups of 8 into ``maxima`` (rows, V // 8 + V % 8) float32; ``consts`` =
    (floor, frac), ``out`` = (totals, maxima)."""
    floor, frac = consts
    totals, maxima = out
    r0, r1 = span
    buf = np.empty(z.shape[1], dtype=np.float32)
    for r in range(r0, r1):
        totals[r] = _survivor_mass(z[r], thr[r], floor, 2.0**frac, buf)
        _group_maxima(z[r], maxima[r])


@numba.njit(**_jit)
def _survivor_mass(row, t, floor, scale, buf):
    """The exact mass of the survivors ``max(row, floor) >= t`` of one row (``buf``: a
    float32 scratch row, receives the exps)."""
    floored_exp_into(row, floor, buf)
    acc = 0
    for i in range(row.size):
        v = row[i]
        v = floor if v < floor else v
        h, _ = trunc_word(np.float64(buf[i]) * scale)
        acc += h if v >= t else 0
    return acc


@numba.njit(**_jit)
def first_pass_rows(x, per_row, consts, out, span):
    """Rows ``span`` = (r0, r1) of the first full-row pass of a call whose logits ``x``
    are the model's (steps 1-5 changed nothing): per row, step 7's z (:func:`_scale_row`,
    into ``z``), and as the row's ``flags`` ask, bit 1: its "raw" log-normaliser
    (``arith.jit.row_log_norm`` of ``x`` with maximum ``raw_max``, NaN where that is not
    finite; into ``g``), bit 2: its exact mass and group maxima (:func:`_survivor_mass`,
    :func:`_group_maxima` of z, no top-k cut; into ``totals``, ``maxima``). ``per_row``
    = (shift, raw_max, t, flags), ``consts`` = (floor, frac), ``out`` = (z, g, totals,
    maxima). The row stays in cache across its parts."""
    shift, raw_max, t, flags = per_row
    floor, frac = consts
    z, g, totals, maxima = out
    r0, r1 = span
    buf = np.empty(x.shape[1], dtype=np.float32)
    for r in range(r0, r1):
        _scale_row(x[r], shift[r], t[r], z[r])
        if flags[r] & 1:
            m = raw_max[r]
            ok = (m > -np.inf) & (m < np.inf)
            g[r] = row_log_norm(x[r], m, buf, frac) if ok else np.nan
        if flags[r] & 2:
            totals[r] = _survivor_mass(z[r], np.float32(-np.inf), floor, 2.0**frac, buf)
            _group_maxima(z[r], maxima[r])


@numba.njit(**_jit)
def _masses_and_keys(row, e, t, consts, q, key):
    """The survivors' masses ``q`` and the bins ``key`` of one row of maxima, whose exps
    are ``e`` (vectorised); ``consts`` = (floor, scale, shift, key_lo, key_hi)."""
    floor, scale, shift, key_lo, key_hi = consts
    bits = row.view(np.int32)
    for i in range(row.size):
        v = row[i]
        vf = floor if v < floor else v
        h, _ = trunc_word(np.float64(e[i]) * scale)
        q[i] = h if vf >= t else 0
        k = (np.int64(bits[i]) & 0x7FFFFFFF) >> shift
        key[i] = min(max(k, key_lo), key_hi) - key_lo


@numba.njit(**_jit)
def lower_bound_rows(maxima, thr, limit, consts, out, span):
    """Rows ``span`` = (r0, r1) of ``ops.nucleus.lower_bound``: the masses of the maxima
    (survivors of ``thr``) summed in bins of their float32 bits (``(bits & 0x7fffffff) >>
    shift``, clamped to [key_lo, key_hi]), the first bin whose mass strictly above fails
    ``float64(above) < limit``, and the bits of its largest value into ``out`` =
    (bound_bits int64, found bool); ``consts`` = (floor, frac, shift, key_lo, key_hi)."""
    floor, frac, shift, key_lo, key_hi = consts
    bound_bits, found = out
    r0, r1 = span
    scale = 2.0**frac
    bins = key_hi - key_lo + 1
    hist = np.empty(bins, dtype=np.int64)
    n = maxima.shape[1]
    e = np.empty(n, dtype=np.float32)
    q = np.empty(n, dtype=np.int64)
    key = np.empty(n, dtype=np.int64)
    for r in range(r0, r1):
        row = maxima[r]
        floored_exp_into(row, floor, e)
        _masses_and_keys(row, e, thr[r], (floor, scale, shift, key_lo, key_hi), q, key)
        hist[:] = 0
        for i in range(n):  # the scatter: the one scalar loop
            hist[key[i]] += q[i]
        above = 0
        b = 0
        while b < bins and np.float64(above) < limit[r]:
            above += hist[b]
            b += 1
        found[r] = b < bins
        bound_bits[r] = ((min(b, bins - 1) + key_lo) << shift) | np.int64(-(2**31))


@numba.njit(**_jit)
def draw_blocks_rows(z, cuts, consts, table, out, span):
    """Rows ``span`` = (r0, r1) of ``ops.draw.draw_by_blocks`` without the (rows, V)
    masses: the block whose running mass first exceeds the row's target (``table`` =
    (bsum, target): the rows' running block sums and targets), then that block's masses
    recomputed (the kept set's:
    ``cuts`` = (tau, least) per row, ``consts`` = (floor, frac, block), the pass of
    ``arith.jit.cut_masses_rows``) and the first token whose running mass exceeds the
    target, into ``out`` (int64)."""
    tau, least = cuts
    floor, frac, block = consts
    bsum, target = table
    r0, r1 = span
    V = z.shape[1]
    scale = 2.0**frac
    e = np.empty(block, dtype=np.float32)
    q = np.empty(block, dtype=np.int64)
    for r in range(r0, r1):
        t = target[r]
        b = 0
        while bsum[r, b] <= t:
            b += 1
        s = b * block
        n = min(V, s + block) - s
        row = z[r, s : s + n]
        floored_exp_into(row, floor, e[:n])
        block_masses(row, e[:n], tau[r], least[r], scale, floor, q[:n], True)
        run = bsum[r, b - 1] if b > 0 else 0
        i = 0
        while i < n - 1 and run + q[i] <= t:
            run += q[i]
            i += 1
        out[r] = s + i
