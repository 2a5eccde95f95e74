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

from detsample.arith.jit import block_masses, floored_exp_into, max8, trunc_word

_jit = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)


@numba.njit(**_jit)
def scale_rows(x, m, t, z, r0, r1):
    """Rows r0..r1 of ``z = float32(float32(x - m) / t)`` (float32: a subtraction, then a
    true division, each rounded once: ``ops.temperature.scale_logits``)."""
    for r in range(r0, r1):
        mr = m[r]
        tr = t[r]
        xr = x[r]
        zr = z[r]
        for i in range(xr.size):
            zr[i] = (xr[i] - mr) / tr


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
    scale = 2.0 ** frac
    buf = np.empty(z.shape[1], dtype=np.float32)
    for r in range(r0, r1):
        row = z[r]
        floored_exp_into(row, floor, buf)
        t = thr[r]
        acc = 0
        for i in range(row.size):
            v = row[i]
            v = floor if v < floor else v
            h, _ = trunc_word(np.float64(buf[i]) * scale)
            acc += h if v >= t else 0
        totals[r] = acc
        _group_maxima(row, maxima[r])


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
    scale = 2.0 ** frac
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
        bound_bits[r] = ((min(b, bins - 1) + key_lo) << shift) | np.int64(-(2 ** 31))


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
    scale = 2.0 ** frac
    e = np.empty(block, dtype=np.float32)
    q = np.empty(block, dtype=np.int64)
    for r in range(r0, r1):
        t = target[r]
        b = 0
        while bsum[r, b] <= t:
            b += 1
        s = b * block
        n = min(V, s + block) - s
        row = z[r, s:s + n]
        floored_exp_into(row, floor, e[:n])
        block_masses(row, e[:n], tau[r], least[r], scale, floor, q[:n], True)
        run = bsum[r, b - 1] if b > 0 else 0
        i = 0
        while i < n - 1 and run + q[i] <= t:
            run += q[i]
            i += 1
        out[r] = s + i

