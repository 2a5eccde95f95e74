"""Pipeline steps 8 and 9 (filters, draw) of the bounded top-k route on host arrays, for CPU tensors.

The candidate arithmetic of a row with a small top-k touches a few dozen values, so on
the CPU its cost is the number of torch operator calls (microseconds each), not the
work. These functions do the same arithmetic on numpy views of the CPU tensors: one
``torch.exp`` (the mass of a token is defined by torch's exp, which numpy's does not
reproduce bit for bit), then integer sums, comparisons and float64 products, which are
exact or correctly rounded IEEE operations and give the same bits in numpy as in torch.
Each function returns what its torch counterpart returns
(:func:`detsample.ops.filters.candidate_cut` with ``draw.kept_cdf``, and
``draw.draw_by_cdf``), and :func:`draw_one_row` does a single row's decision and draw
on Python scalars (cheaper than the arrays for a few rows); tests/ops/test_hostcut.py
proves them bitwise equal, ties, ``-inf`` candidates and huge magnitudes included.
Bitwise batch-invariant: every operation is row-local.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from detsample import rules
from detsample.rules import PAD_ID
#: up to this many rows, :func:`draw_one_row` per row costs less than the array form
#: (measured at one thread: ~13 us a row against ~90 us for the arrays at any small R)
SCALAR_ROWS = 4


@dataclass(frozen=True)
class CandidateTables:
    """What the bounded top-k route decides for R rows (host arrays).

    fits: (R,) bool, every top-k survivor is among the candidates (else the row needs
    the sort); n: (R,) int64 kept prefix length; tau: (R,) float32 threshold (kept =
    ``z >= tau``); total: (R,) int64 exact kept mass ``Q``; sorted_ids: (R, K) int64 kept
    ids ascending, then ``PAD_ID``; csum: (R, K) int64 running mass in that order.
    """

    fits: np.ndarray
    n: np.ndarray
    tau: np.ndarray
    total: np.ndarray
    sorted_ids: np.ndarray
    csum: np.ndarray
    tokens: np.ndarray | None = None  # (R,) int64 drawn, when uniforms were given


def candidate_tables(vals: torch.Tensor, ids: torch.Tensor, k_index: torch.Tensor,
                     cut_k: bool, top_p: torch.Tensor | None, min_p: torch.Tensor | None,
                     *, frac: int, k_max: int, u: np.ndarray | None = None
                     ) -> CandidateTables:
    """Top-k, top-p and min-p on a row's candidates, and its draw table.

    vals: (R, K1) float32 CPU tensor, the K1 = ``min(k_max + 1, V)`` largest scaled
    logits of each row, descending (``torch.topk``: ``filters.topk_candidates`` before
    its cut, or ``filters.logit_candidates``); ids: (R, K1) int64 their token ids;
    k_index, cut_k, top_p, min_p: as in :func:`detsample.ops.filters.candidate_cut`
    (CPU tensors); frac: fixed-point bits; u: (R,) float64 uniforms, or None. The same
    ``fits``, ``n`` (hence ``tau``) and table as ``topk_candidates`` / ``candidate_cut``
    / ``draw.kept_cdf``, bit for bit, and with ``u`` the tokens :func:`draw_by_cdf` draws
    from that table.
    """
    e = torch.exp(vals).numpy()[:, :k_max]  # the masses' exp is torch's (element-wise)
    v_all, i_all = vals.numpy(), ids.numpy()
    r = np.arange(v_all.shape[0])[:, None]  # row of each gathered entry
    thr = v_all[r, k_index.numpy()] if cut_k else v_all[:, k_max - 1:k_max]
    fits = v_all[:, k_max] < thr[:, 0] if v_all.shape[1] > k_max else \
        np.ones(v_all.shape[0], dtype=bool)
    v, i = v_all[:, :k_max], i_all[:, :k_max]
    q = rules.mass(e, frac)
    kept = v >= thr if cut_k else None
    if top_p is not None:
        qk = q * kept if kept is not None else q
        csum = np.cumsum(qk, axis=1)
        limit = rules.top_p_limit(top_p.numpy(), csum[:, -1:])
        c = rules.top_p_keeps(csum - qk, limit).sum(1, keepdims=True)
        keep_p = v >= v[r, c - 1]
        kept = keep_p if kept is None else kept & keep_p
    if min_p is not None:
        above = rules.min_p_keeps(e, min_p.numpy())
        kept = above if kept is None else kept & above
    if kept is None:
        kept = np.ones(v.shape, dtype=bool)
    n = kept.sum(1, dtype=np.int64)
    tau = v[r[:, 0], n - 1]
    key = np.where(kept, i, PAD_ID)
    order = np.argsort(key, axis=1)
    table = np.cumsum((q * kept)[r, order], axis=1)
    sorted_ids = key[r, order]
    tokens = None if u is None else draw_by_cdf(sorted_ids, table, u)
    return CandidateTables(fits, n, tau, table[:, -1], sorted_ids, table, tokens)


def draw_by_cdf(sorted_ids: np.ndarray, csum: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``draw.draw_by_cdf`` on host arrays: (R,) int64 tokens for uniforms ``u`` (R,)
    float64 in (0, 1). The target ``t = min(floor(u * float64(Q)), Q - 1)`` and the first
    running mass above it (``searchsorted(right=True)`` on a non-decreasing row is the
    count of entries ``<= t``)."""
    j = rules.first_above(csum, rules.draw_target(u, csum[:, -1]))
    return sorted_ids[np.arange(len(j)), j]


def draw_one_row(v: list[float], e: list[float], ids: list[int],
                 row: tuple[int, bool, float | None, float | None], *, frac: int, k_max: int,
                 u: float) -> tuple[bool, int]:
    """:func:`candidate_tables` with its draw for ONE row, on Python scalars: ``(fits,
    token)``.

    v: the row's K1 scaled candidates (Python floats holding float32 values, descending,
    no NaN: ``torch.topk`` order); e: their float32 ``torch.exp`` (at least ``k_max``);
    ids: their token ids; ``row`` = (k_index, cut_k, top_p (float64, ``inf`` when
    disabled), min_p (a float32 value)): the row's entries of the :class:`~detsample.sampling.rowplan.CandidateFilters`
    tensors (None: no row of the batch uses that filter); u: the row's float64 uniform.

    At a batch of one, the ~35 numpy calls of the array form cost more than its
    arithmetic. Here each filter's kept set is found as the prefix it is (``v`` and so
    ``e`` are non-increasing: ``v >= thr``, ``v >= cut`` and ``e >= min_p`` hold on a
    prefix, and their conjunction on the shortest one), and every value is the same IEEE
    operation on the same values (a float32 product by a power of two is exact in
    float64, masses are exact Python ints, ``int -> float64`` rounds to nearest in both
    forms), so ``fits`` and the token are :func:`candidate_tables`' bit for bit
    (tests/ops/test_hostcut.py).
    """
    k_index, cut_k, top_p, min_p = row
    thr = v[k_index] if cut_k else v[k_max - 1]
    fits = v[k_max] < thr if len(v) > k_max else True
    n = k_max
    if cut_k:  # v >= thr: up to k_index, then the tie group at it
        n = k_index + 1
        while n < k_max and v[n] >= thr:
            n += 1
    q = [rules.mass(x, frac) for x in e[:n]]
    if top_p is not None:
        limit = rules.top_p_limit(top_p, sum(q))
        keeps = rules.top_p_keeps
        c, before = 0, 0  # the candidates whose preceding kept mass is below the limit
        while c < k_max and keeps(before, limit):
            before += q[c] if c < n else 0
            c += 1
        cut = v[c - 1] if c else v[k_max - 1]  # c = 0: the array form's v[:k_max][-1]
        m = 0
        while m < n and v[m] >= cut:
            m += 1
        n = m
    if min_p is not None:
        m = 0
        while m < n and rules.min_p_keeps(e[m], min_p):
            m += 1
        n = m
    chosen = sorted(zip(ids[:n], q[:n]))  # token-id order
    j = rules.first_above(itertools.accumulate(m for _, m in chosen),
                          rules.draw_target(u, sum(q[:n])))
    # (j == n: nothing kept, never from the sampler: the top candidate always is)
    return fits, chosen[j][0] if j < n else PAD_ID


def draw_by_blocks(q: np.ndarray, bsum: np.ndarray, u: np.ndarray, block: int) -> np.ndarray:
    """``draw.draw_by_blocks`` on host arrays, a row at a time (for a few rows):
    (R,) int64 tokens.

    q: (R, V) int64 masses; bsum: (R, nb) int64 running sums of blocks of ``block``
    tokens (the last may be shorter); u: (R,) float64 in (0, 1). The same target as
    :func:`draw_by_cdf`; the block is the count of running block sums ``<= t`` (what
    ``searchsorted(right=True)`` finds on a non-decreasing row), the token the count of
    running sums ``<= t`` inside it. The torch form pads a short last block with the
    last token's mass; that count never reaches the padding (``t`` is below the row's
    total), so the block's real entries alone give the same count.
    """
    out = np.empty(len(u), dtype=np.int64)
    for r in range(len(u)):
        row = bsum[r]
        t = rules.draw_target(float(u[r]), int(row[-1]))
        blk = rules.first_above(row, t)
        base = int(row[blk - 1]) if blk else 0
        start = blk * block
        out[r] = start + rules.first_above(np.cumsum(q[r, start:start + block]), t - base)
    return out
