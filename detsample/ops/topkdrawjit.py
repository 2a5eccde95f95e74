"""numba kernel of :func:`detsample.ops.topkdraw.draw` (imported on first use; it imports
numba): steps 7-10 of a row with a small top-k in one pass over its logits -- the row's
maximum and normaliser, the stable top-K candidates, their scaled values, exps and
masses, the kept prefix (top-k, top-p, the element-wise filters), the id-order CDF, the
draw and the chosen token's "raw" logprob.

Each line is the torch path's operation on the same values, spelled for one row (the
torch path is the reference: tests/ops/test_topkdraw.py holds the two equal bit for bit):

* candidates: :func:`detsample.ops.selectjit._topk_row` on the logits (the stable sort's
  first K), scaled as ``float32(float32(x - m) / T)`` (``ops.temperature.scale_logits``);
* ``e = exp64(z)``, ``q = trunc(e * 2**F)`` (``rules.mass``);
* ``ops.filters.kept_prefix``: ``thr`` = the k-th candidate; top-p's limit ``top_p *
  float64(Z)`` (``rules.top_p_limit``; ``+inf`` where disabled) with ``Z`` the kept top-k
  mass, its count of exclusive running sums ``float64(above) < limit``
  (``rules.top_p_keeps``) and its cut value; the element-wise filters as ``e >= least``
  (``ops.draw.least_kept``);
* ``ops.draw.id_order_cdf`` / ``draw_by_cdf``: the kept ids ascending, their running
  masses, ``t = min(floor(u * float64(Q)), Q - 1)`` (``rules.draw_target``) and the first
  running mass above ``t`` (``rules.first_above``);
* the raw logprob: ``float32((float64(x_tok) - float64(m)) - G)`` (``arith.picked``).
"""

from __future__ import annotations

import numba
import numpy as np

from detsample.arith.jit import exp64 as _exp64
from detsample.arith.jit import pick, row_log_norm, row_max, trunc_word
from detsample.ops.selectjit import _topk_row

_jit = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)

#: a row's outcome: drawn; not valid (a NaN, a +inf or no finite value: the caller's
#: general path sanitises it); undecided (a tie group at the k-th value may spill past
#: the candidates: the general path grows them)
DRAWN, INVALID, UNDECIDED = 0, 1, 2


@numba.njit(**_jit)
def kept_mask(cand, k_index, top_p, least, kept):
    """The kept mask of descending candidates ``cand`` = (z, e, q): their scaled values,
    exps and masses (``ops.filters.kept_prefix`` of one row: the top-k boundary ``k_index``, top-p
    ``top_p`` (``>= 1``: off), the element-wise filters' least kept exp ``least``) into
    ``kept`` (bool); returns the kept count."""
    z, e, q = cand
    K = z.size
    thr = z[k_index]
    total = 0
    for i in range(K):
        if z[i] >= thr:
            total += q[i]
    limit = np.inf if top_p >= 1.0 else top_p * np.float64(total)
    c = 0
    above = 0
    for i in range(K):  # the exclusive running sums of the top-k survivors' masses
        if np.float64(above) < limit:
            c += 1
        if z[i] >= thr:
            above += q[i]
    cut = z[c - 1]
    n = 0
    for i in range(K):
        kept[i] = (z[i] >= thr) & (z[i] >= cut) & (e[i] >= least)
        n += kept[i]
    return n


@numba.njit(**_jit)
def draw_kept(ids, q, kept, u):
    """The token of uniform ``u`` over the kept candidates (at least one) in id order
    (``ops.draw.id_order_cdf`` + ``draw_by_cdf``) and their exact mass ``Q``: (token,
    Q)."""
    n = 0
    for i in range(ids.size):
        n += kept[i]
    kid = np.empty(n, dtype=np.int64)
    kq = np.empty(n, dtype=np.int64)
    j = 0
    for i in range(ids.size):
        if kept[i]:
            kid[j] = ids[i]
            kq[j] = q[i]
            j += 1
    order = np.argsort(kid)
    Q = 0
    for i in range(n):
        Q += kq[i]
    t = min(np.int64(np.floor(u * np.float64(Q))), Q - 1)
    run = 0
    for i in range(n):
        run += kq[order[i]]
        if run > t:
            return kid[order[i]], Q
    return kid[order[n - 1]], Q  # pragma: no cover - t < Q


@numba.njit(**_jit)
def draw_rows(x, params, given, out, span):
    """Rows ``span`` = (r0, r1) of a (rows, n) float32 ``x``: each row's token and raw
    logprob into ``out`` = (tokens (rows,) int64, logprobs (rows,) float32, tau (rows,)
    float32 the smallest kept scaled value, total (rows,) int64 the exact kept mass,
    status (rows,) int8: :data:`DRAWN`, :data:`INVALID` or :data:`UNDECIDED`, then the
    other four are unspecified). ``params`` = (K, k_index (rows,) int64, temperatures
    (rows,) float32, top_p (rows,) float64 ``+inf`` where disabled, least (rows,) float32
    ``-inf`` where no element-wise filter, frac the masses' fraction bits, check: the
    deterministic mode's test that no tie group at the k-th value spills past the K
    candidates); ``given`` = (u (rows,) float64 the uniforms, m the rows' maxima (float32,
    ``arith.cpu.normalisers``'), or an empty array: found here, g (rows,) float64 the
    normalisers where known with ``m``, else NaN: computed here)."""
    K, k_index, temps, top_p, least, frac, check = params
    u, known_max, g = given
    tok, lp, tau, total, status = out
    r0, r1 = span
    n = x.shape[1]
    buf = np.empty(n, dtype=np.float32)
    scratch = (np.empty(K, dtype=np.float32), np.empty(K, dtype=np.int64), np.empty(n // 8, dtype=np.float32))
    vals = np.empty(K, dtype=np.float32)
    ids = np.empty(K, dtype=np.int64)
    z = np.empty(K, dtype=np.float32)
    e = np.empty(K, dtype=np.float32)
    q = np.empty(K, dtype=np.int64)
    kept = np.empty(K, dtype=np.bool_)
    scale = 2.0**frac
    for r in range(r0, r1):
        row = x[r]
        m = known_max[r] if known_max.size else row_max(row, buf)
        if not ((m > -np.inf) & (m < np.inf)):
            status[r] = INVALID
            continue
        G = g[r] if g[r] == g[r] else row_log_norm(row, m, buf, frac)
        _topk_row(row, K, scratch, vals, ids)
        T = temps[r]
        for i in range(K):
            z[i] = np.float32(vals[i] - m) / T
            e[i] = _exp64(np.float64(z[i]))
            q[i], _ = trunc_word(np.float64(e[i]) * scale)
        if check and n > K and not (z[K - 1] < z[k_index[r]]):
            status[r] = UNDECIDED
            continue
        n_kept = kept_mask((z, e, q), k_index[r], top_p[r], least[r], kept)
        if n_kept == 0:  # not for admissible parameters (the maximum is always kept)
            status[r] = INVALID
            continue
        tau[r] = z[n_kept - 1]
        tok[r], total[r] = draw_kept(ids, q, kept, u[r])
        lp[r] = pick(row[tok[r]], m, G)
        status[r] = DRAWN
