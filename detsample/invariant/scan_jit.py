"""The numba kernels of :mod:`detsample.invariant.scans` (this module imports numba;
scans.py imports it on first use).

Each kernel runs a recurrent mixer's update over all the positions of a call, for the
rows ``[start, stop)`` of ``batch x heads`` (one row: one sequence's head, independent of
every other row, so a split over threads changes no bit). Compiled without fast-math
(no contraction into fused multiply-adds, no reassociation: tests/invariant/test_scans.py
checks the assembly); LLVM vectorises the inner loops across the state's columns, which
changes no bit -- each lane performs the same operations in the same order.

The arithmetic, per position (the definition; ``oracles/scans.py`` spells it in numpy):

* elementwise updates of the float32 state in float32, one IEEE operation each, in the
  order the modeling code writes them;
* every contraction over the state's rows (``sum_i S[i, j] k[i]``) a float64 sum of the
  exact float64 products of the float32 values, added in the order ``i = 0, 1, ...``, then
  rounded once to float32;
* ``exp`` is detsample's (:func:`detsample.arith.jit.exp64` of the float64 argument,
  rounded to float32).
"""

from __future__ import annotations

import numba
import numpy as np

from detsample.arith.jit import exp64

_jit = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)


@numba.njit(**_jit)
def gated_delta_rows(q, k, v, g, beta, state, out, start, stop):
    """The gated delta rule over ``T`` positions for rows ``[start, stop)``.

    q, k (R, T, dk), v (R, T, dv), g (R, T, dk), beta (R, T): float32, C-contiguous (q
    already normalised and scaled as the modeling code does; g one decay per key feature:
    Kimi delta attention's, or a gated delta-net's one per head repeated); state (R, dk, dv)
    float32, updated in place; out (R, T, dv) float32. Per position:
    ``S[i, :] = S[i, :] * exp(g[i])``; ``delta = (v - S^T k) * beta``; ``S = S + k delta^T``;
    ``o = S^T q``.
    """
    dk, dv = k.shape[2], v.shape[2]
    acc = np.empty(dv, np.float64)
    delta = np.empty(dv, np.float32)
    for r in range(start, stop):
        s = state[r]
        for t in range(q.shape[1]):
            for j in range(dv):
                acc[j] = 0.0
            for i in range(dk):
                decay = np.float32(exp64(np.float64(g[r, t, i])))
                ki = np.float64(k[r, t, i])
                for j in range(dv):
                    x = s[i, j] * decay
                    s[i, j] = x
                    acc[j] += np.float64(x) * ki
            b = beta[r, t]
            for j in range(dv):
                delta[j] = (v[r, t, j] - np.float32(acc[j])) * b
                acc[j] = 0.0
            for i in range(dk):
                ki = k[r, t, i]
                qi = np.float64(q[r, t, i])
                for j in range(dv):
                    x = s[i, j] + ki * delta[j]
                    s[i, j] = x
                    acc[j] += np.float64(x) * qi
            for j in range(dv):
                out[r, t, j] = np.float32(acc[j])


@numba.njit(**_jit)
def ssd_rows(x, dt, a, bm, cm, d, state, out, start, stop):
    """The Mamba 2 (state space duality) update over ``T`` positions for rows
    ``[start, stop)`` of ``batch x heads`` (row ``r``: batch ``r // H``, head ``r % H``,
    group ``head // (H // G)``).

    x (B, H, T, P), dt (B, H, T) (after its bias, softplus and limit), a (H,), bm, cm
    (B, G, T, N), d (H,) or empty (no skip): float32, C-contiguous; state (B, H, P, N)
    float32, updated in place; out (B, H, T, P) float32. Per position:
    ``dA = exp(dt * a)``; ``S[p, n] = S[p, n] * dA + (dt * B[n]) * x[p]``;
    ``y[p] = sum_n S[p, n] C[n]`` (+ ``x[p] * d``).
    """
    heads, groups = x.shape[1], bm.shape[1]
    per, n_state = heads // groups, bm.shape[3]
    db = np.empty(n_state, np.float32)
    for r in range(start, stop):
        b, h = r // heads, r % heads
        grp = h // per
        s = state[b, h]
        for t in range(x.shape[2]):
            step = dt[b, h, t]
            da = np.float32(exp64(np.float64(step * a[h])))
            for n in range(n_state):
                db[n] = step * bm[b, grp, t, n]
            for p in range(x.shape[3]):
                xp = x[b, h, t, p]
                acc = 0.0
                for n in range(n_state):
                    y = s[p, n] * da + db[n] * xp
                    s[p, n] = y
                    acc += np.float64(y) * np.float64(cm[b, grp, t, n])
                o = np.float32(acc)
                if d.shape[0]:
                    o = o + xp * d[h]
                out[b, h, t, p] = o


@numba.njit(**_jit)
def selective_rows(x, dt, a, bm, cm, d, state, out, start, stop):
    """The Mamba (1) selective-scan update over ``T`` positions for rows ``[start, stop)``
    of ``batch x channels`` (row ``r``: batch ``r // I``, channel ``r % I``).

    x, dt (B, I, T) (dt after its bias and softplus), a (I, N), bm, cm (B, T, N), d (I,) or
    empty: float32, C-contiguous; state (B, I, N) float32, updated in place; out (B, I, T)
    float32. Per position: ``S[n] = S[n] * exp(dt * a[n]) + (dt * B[n]) * x``;
    ``y = sum_n S[n] C[n]`` (+ ``x * d``).
    """
    inner, n_state = x.shape[1], a.shape[1]
    for r in range(start, stop):
        b, i = r // inner, r % inner
        s = state[b, i]
        for t in range(x.shape[2]):
            step, xi = dt[b, i, t], x[b, i, t]
            acc = 0.0
            for n in range(n_state):
                da = np.float32(exp64(np.float64(step * a[i, n])))
                y = s[n] * da + (step * bm[b, t, n]) * xi
                s[n] = y
                acc += np.float64(y) * np.float64(cm[b, t, n])
            o = np.float32(acc)
            if d.shape[0]:
                o = o + xi * d[i]
            out[b, i, t] = o


@numba.njit(**_jit)
def lightning_rows(q, k, v, ratio, state, out, start, stop):
    """MiniMax's lightning attention (linear attention with one decay per head) over ``T``
    positions for rows ``[start, stop)`` of ``batch x heads``.

    q, k (R, T, d), v (R, T, dv): float32, C-contiguous; ratio (R,) float32 (``exp(-slope)``
    of the row's head, as the modeling code computes it); state (R, d, dv) float32, updated
    in place; out (R, T, dv) float32. Per position, in the modeling code's order:
    ``S[i, j] = ratio * S[i, j] + k[i] * v[j]`` (two float32 products and a float32 sum:
    the ops' ``matmul`` of one term is one rounded product); ``o[j] = sum_i q[i] S[i, j]``.
    """
    d, dv = k.shape[2], v.shape[2]
    acc = np.empty(dv, np.float64)
    for r in range(start, stop):
        s = state[r]
        rr = ratio[r]
        for t in range(q.shape[1]):
            for j in range(dv):
                acc[j] = 0.0
            for i in range(d):
                ki = k[r, t, i]
                qi = np.float64(q[r, t, i])
                for j in range(dv):
                    x = rr * s[i, j] + ki * v[r, t, j]
                    s[i, j] = x
                    acc[j] += np.float64(x) * qi
            for j in range(dv):
                out[r, t, j] = np.float32(acc[j])
