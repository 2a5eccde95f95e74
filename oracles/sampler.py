"""The whole deterministic sampler, end to end, in float64 numpy with per-row loops.

This is the readable specification of detsample's pipeline (docs/sampling.md steps 2, 5-10;
penalties, processors and grammar masks have their own oracles). It never imports
torch. Integer outcomes (kept sets, greedy ids, seeded draws) must match the library
exactly away from near-ties; each row reports ``margin``, the smallest relative
distance of any decision from its threshold, so tests can tell near-ties apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from oracles.rng import row_uniform

F32_MIN = float(np.finfo(np.float32).min)
F32_MAX = float(np.finfo(np.float32).max)


def frac_bits(vocab_size: int) -> int:
    return min(52, 62 - max(1, math.ceil(math.log2(max(vocab_size, 2)))))


@dataclass
class RowParams:
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    logit_bias: dict | None = None
    seed: int = 0
    logprobs_mode: str = "raw"

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass
class RowResult:
    token: int
    logprob: float
    kept: list            # sorted kept token ids (empty for greedy rows)
    margin: float         # relative distance of the closest decision to its threshold


def sanitize(row: np.ndarray) -> np.ndarray:
    out = np.array(row, dtype=np.float64)
    for i, v in enumerate(out):
        if math.isnan(v):
            out[i] = F32_MIN
        elif v == math.inf:
            out[i] = F32_MAX
    return out


def log_softmax(v: np.ndarray) -> np.ndarray:
    finite = v[np.isfinite(v)]
    if finite.size == 0:
        return np.full_like(v, -math.inf)
    m = finite.max()
    s = 0.0
    for x in v:
        if x != -math.inf:
            s += math.exp(x - m)
    return np.array([x - m - math.log(s) if x != -math.inf else -math.inf for x in v])


def sample_row(logits: np.ndarray, p: RowParams, position: int) -> RowResult:
    """One row through the pipeline (float64), the specification of Sampler.sample."""
    V = len(logits)
    raw = sanitize(logits)
    x = raw.copy()
    for tid, b in (p.logit_bias or {}).items():  # step 5 is a float32 add: round like it
        with np.errstate(over="ignore"):  # an overflow to +inf is sanitised below
            x[int(tid)] = float(np.float32(x[int(tid)]) + np.float32(b))
    x = np.where(x == math.inf, F32_MAX, x)
    if np.all(x == -math.inf):
        return RowResult(-1, -math.inf, [], math.inf)
    m = x.max()
    if p.greedy:
        tok = int(np.argmax(x))  # first maximum: lowest id
        ties = np.sort(x)[::-1]
        margin = math.inf if V == 1 else (ties[0] - ties[1]) / max(1.0, abs(ties[0]))
        if p.logprobs_mode == "raw":
            lp = log_softmax(raw)[tok]
        elif p.logprobs_mode == "scaled":
            lp = log_softmax(x - m)[tok]
        else:
            lp = 0.0
        return RowResult(tok, float(lp), [], margin)
    T = float(np.float32(p.temperature))
    z = (x - m) / T
    e = np.exp(z)
    frac = frac_bits(V)
    q = [int(math.floor(v * 2.0**frac)) for v in e]
    order = sorted(range(V), key=lambda i: (-z[i], i))
    margin = math.inf
    # top-k: keep z_i >= k-th largest value
    k = V if p.top_k == -1 else min(p.top_k, V)
    thr_k = z[order[k - 1]]
    kept = [i for i in range(V) if z[i] >= thr_k]
    if k < V:
        below = [z[i] for i in range(V) if z[i] < thr_k]
        if below:
            margin = min(margin, (thr_k - max(below)) / max(1.0, abs(thr_k)))
    # top-p: mass strictly above i < top_p * Z (masses in fixed point, exact integers)
    if p.top_p < 1.0:
        Z = sum(q[i] for i in kept)
        keep_p = []
        for i in kept:
            above = sum(q[j] for j in kept if z[j] > z[i])
            if float(above) < p.top_p * float(Z):
                keep_p.append(i)
            margin = min(margin, abs(above - p.top_p * Z) / Z)
        kept = keep_p
    # min-p: exp(z_i) >= min_p (exp of the max is 1)
    if p.min_p > 0.0:
        mp = float(np.float32(p.min_p))
        for i in kept:
            margin = min(margin, abs(e[i] - mp))
        kept = [i for i in kept if e[i] >= mp]
    kept.sort()
    # inverse CDF in token-id order over the kept fixed-point masses
    u = row_uniform(p.seed, position)
    Q = sum(q[i] for i in kept)
    t = min(int(math.floor(u * float(Q))), Q - 1)
    acc = 0
    tok = kept[-1]
    for i in kept:
        acc += q[i]
        if acc > t:
            tok = i
            break
    # distance of u*Q from the nearest CDF boundary, relative to Q
    acc = 0
    for i in kept:
        acc += q[i]
        margin = min(margin, abs(acc - u * Q) / Q)
    if p.logprobs_mode == "raw":
        lp = log_softmax(raw)[tok]
    elif p.logprobs_mode == "scaled":
        lp = log_softmax(z)[tok]
    else:
        lp = z[tok] - math.log(Q * 2.0**-frac)
    return RowResult(tok, float(lp), kept, margin)
