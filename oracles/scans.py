"""The fused recurrent scans (``detsample.invariant.scans``) per row in numpy: the
specification, reproducing the kernels' bits. Never imports torch.

One row is one sequence's head; each function runs its positions in order. float32
arrays in, float32 arrays out: every elementwise step is one IEEE float32 operation
(numpy rounds each element once), every contraction over the state's rows a float64 sum
of exact products (a product of two float32 values is exact in float64) added in the
order of the rows, rounded once to float32; ``exp`` is detsample's.
"""

from __future__ import annotations

import numpy as np

from oracles.arith import exp32


def _contract(s: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``sum_i s[i, j] w[i]`` for every column j: float64, rows added in order, rounded
    once to float32. s (I, J) float32, w (I,) float32 -> (J,) float32."""
    acc = np.zeros(s.shape[1], dtype=np.float64)
    for i in range(s.shape[0]):
        acc = acc + s[i].astype(np.float64) * np.float64(w[i])
    return acc.astype(np.float32)


def gated_delta(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule of one row: q, k (T, dk), v (T, dv), g (T, dk) (a decay per
    key feature), beta (T,), state (dk, dv). Returns (out (T, dv), final state)."""
    s = state.astype(np.float32).copy()
    out = np.empty((q.shape[0], v.shape[1]), dtype=np.float32)
    for t in range(q.shape[0]):
        s = s * exp32(g[t])[:, None]
        delta = (v[t] - _contract(s, k[t])) * beta[t]
        s = s + k[t][:, None] * delta[None, :]
        out[t] = _contract(s, q[t])
    return out, s


def selective(
    x: np.ndarray,
    dt: np.ndarray,
    a: np.ndarray,
    bm: np.ndarray,
    cm: np.ndarray,
    d: np.float32 | None,
    state: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The Mamba (1) update of one row (one channel): x, dt (T,), a (N,), bm, cm (T, N),
    d a scalar or None, state (N,). Returns (out (T,), final state)."""
    s = state.astype(np.float32).copy()
    out = np.empty(x.shape, dtype=np.float32)
    for t in range(x.shape[0]):
        s = s * exp32(dt[t] * a) + (dt[t] * bm[t]) * x[t]
        y = _contract(s[:, None], cm[t])[0]
        out[t] = y if d is None else y + x[t] * d
    return out, s


def ssd(
    x: np.ndarray,
    dt: np.ndarray,
    a: np.float32,
    bm: np.ndarray,
    cm: np.ndarray,
    d: np.float32 | None,
    state: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The Mamba 2 update of one row (one head): x (T, P), dt (T,), a scalar, bm, cm
    (T, N) (its group's), d a scalar or None, state (P, N). Returns (out (T, P), final
    state)."""
    s = state.astype(np.float32).copy()
    out = np.empty(x.shape, dtype=np.float32)
    for t in range(x.shape[0]):
        da = exp32(np.float32(dt[t] * a)[None])[0]
        db = dt[t] * bm[t]
        s = s * da + db[None, :] * x[t][:, None]
        y = _contract(s.T, cm[t])
        out[t] = y if d is None else y + x[t] * d
    return out, s


def lightning(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, ratio: np.float32, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """MiniMax's lightning attention of one row (one head): q, k (T, d), v (T, dv), ratio
    the head's ``exp(-slope)``, state (d, dv). Returns (out (T, dv), final state)."""
    s = state.astype(np.float32).copy()
    out = np.empty((q.shape[0], v.shape[1]), dtype=np.float32)
    for t in range(q.shape[0]):
        s = np.float32(ratio) * s + k[t][:, None] * v[t][None, :]
        out[t] = _contract(s, q[t])
    return out, s
