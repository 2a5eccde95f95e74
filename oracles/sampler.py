"""The whole deterministic sampler, end to end, in numpy with per-row loops.

This is the readable specification of detsample's pipeline (docs/sampling.md steps 2, 5-10;
penalties, processors and grammar masks have their own oracles). It never imports
torch. It computes what the library computes -- float32 where the library's step is a
float32 operation (the bias add, ``x - max``, the division by the temperature), and
detsample's defined exp / log / log_softmax (oracles/arith.py) everywhere else -- so
the library must reproduce its token ids AND its logprob bits exactly, on every row.
``margin`` still reports each row's smallest relative distance of a decision from its
threshold (informative: a platform's exp would decide differently within it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from oracles import arith
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
    kept: list  # sorted kept token ids (empty for greedy rows)
    margin: float  # relative distance of the closest decision to its threshold


def sanitize(row: np.ndarray) -> np.ndarray:
    """Step 2: NaN -> the lowest float32, +inf -> the largest (float32 values)."""
    out = np.array(row, dtype=np.float32)
    for i, v in enumerate(out.tolist()):
        if math.isnan(v):
            out[i] = F32_MIN
        elif v == math.inf:
            out[i] = F32_MAX
    return out


def log_softmax(v: np.ndarray) -> np.ndarray:
    """detsample's log_softmax of one float32 row (oracles/arith.py)."""
    return arith.log_softmax(np.asarray(v, dtype=np.float32))


def sample_row(logits: np.ndarray, p: RowParams, position: int) -> RowResult:
    """One row through the pipeline, the specification of Sampler.sample."""
    V = len(logits)
    raw = sanitize(np.asarray(logits, dtype=np.float32))  # "raw": the sanitised logits
    x = raw.copy()
    with np.errstate(over="ignore"):  # step 5 is a float32 add; +inf is sanitised below
        for tid, b in (p.logit_bias or {}).items():
            x[int(tid)] = x[int(tid)] + np.float32(b)
    x = np.where(x == np.inf, np.float32(F32_MAX), x).astype(np.float32)
    if np.all(x == -np.inf):
        return RowResult(-1, -math.inf, [], math.inf)
    m = x.max()
    if p.greedy:
        tok = int(np.argmax(x))  # first maximum: lowest id
        ties = np.sort(x.astype(np.float64))[::-1]
        margin = math.inf if V == 1 else (ties[0] - ties[1]) / max(1.0, abs(ties[0]))
        if p.logprobs_mode == "raw":
            lp = log_softmax(raw)[tok]
        elif p.logprobs_mode == "scaled":
            lp = log_softmax(x - m)[tok]  # temperature 1: z = x - max in float32
        else:
            lp = 0.0
        return RowResult(tok, float(lp), [], margin)
    T = np.float32(p.temperature)
    with np.errstate(over="ignore"):  # (x - m) / T may overflow to -inf: no mass
        z = ((x - m) / T).astype(np.float32)  # float32 subtraction, then float32 division
    e = arith.exp32(z)
    frac = arith.frac_bits(V)
    q = [int(v) for v in (e.astype(np.float64) * 2.0**frac).tolist()]  # trunc, exact
    zf = z.astype(np.float64).tolist()
    order = sorted(range(V), key=lambda i: (-zf[i], i))
    margin = math.inf
    # top-k: keep z_i >= k-th largest value
    k = V if p.top_k == -1 else min(p.top_k, V)
    thr_k = zf[order[k - 1]]
    # (a -inf logit holds no mass and is never kept, even at threshold -inf)
    kept = [i for i in range(V) if zf[i] >= thr_k and x[i] != -np.inf]
    if k < V:
        below = [zf[i] for i in range(V) if zf[i] < thr_k]
        if below:
            margin = min(margin, (thr_k - max(below)) / max(1.0, abs(thr_k)))
    # top-p: mass strictly above i < top_p * Z (masses in fixed point, exact integers)
    if p.top_p < 1.0:
        Z = sum(q[i] for i in kept)
        keep_p = []
        for i in kept:
            above = sum(q[j] for j in kept if zf[j] > zf[i])
            if float(above) < p.top_p * float(Z):
                keep_p.append(i)
            margin = min(margin, abs(above - p.top_p * Z) / Z)
        kept = keep_p
    # min-p: exp(z_i) >= min_p (exp of the max is 1)
    if p.min_p > 0.0:
        mp = np.float32(p.min_p)
        for i in kept:
            margin = min(margin, abs(float(e[i]) - float(mp)))
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
    return RowResult(tok, float(_logprob(p.logprobs_mode, raw, x, z, T, kept, tok, Q, frac)), kept, margin)


def _logprob(mode: str, raw, x, z, T, kept, tok: int, Q: int, frac: int) -> np.float32:
    """Step 10 for a sampled token, in the row's mode."""
    if mode == "raw":
        return log_softmax(raw)[tok]
    if mode == "scaled":
        return log_softmax(z)[tok]
    if mode == "processed":  # vLLM's: log_softmax over the kept x / T
        s = np.full(len(x), -np.inf, dtype=np.float32)
        s[kept] = (x[kept] / T).astype(np.float32)
        return log_softmax(s)[tok]
    # "processed_fixed": the scaled logit less the log of the exact kept mass
    return np.float32(np.float64(z[tok]) - arith.log64(float(Q) * 2.0**-frac))
