"""Pipeline step 8 (filters and the draw's table) of the bounded top-k route on host arrays, for CPU tensors.

The candidate arithmetic of a row with a small top-k touches a few dozen values, so on
the CPU its cost is the number of torch operator calls (microseconds each), not the
work. These functions do the same arithmetic on numpy views of the CPU tensors: one
``torch.exp`` (the mass of a token is defined by torch's exp, which numpy's does not
reproduce bit for bit), then integer sums, comparisons and float64 products, which are
exact or correctly rounded IEEE operations and give the same bits in numpy as in torch.
:func:`candidate_tables` returns what its torch counterpart returns
(:func:`detsample.ops.filters.candidate_cut` with ``draw.kept_cdf``);
tests/ops/test_hostcut.py proves them bitwise equal, ties, ``-inf`` candidates and huge
magnitudes included.
Bitwise batch-invariant: every operation is row-local.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from detsample import rules
from detsample.rules import PAD_ID


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


def candidate_tables(vals: torch.Tensor, ids: torch.Tensor, k_index: torch.Tensor,
                     cut_k: bool, top_p: torch.Tensor | None, min_p: torch.Tensor | None,
                     *, frac: int, k_max: int) -> CandidateTables:
    """Top-k, top-p and min-p on a row's candidates, and its draw table.

    vals: (R, K1) float32 CPU tensor, the K1 = ``min(k_max + 1, V)`` largest scaled
    logits of each row, descending (``torch.topk``, or ``filters.logit_topk``); ids:
    (R, K1) int64 their token ids;
    k_index, cut_k, top_p, min_p: as in :func:`detsample.ops.filters.candidate_cut`
    (CPU tensors); frac: fixed-point bits. The same ``fits``, ``n`` (hence ``tau``) and
    table as ``filters.cut_candidates`` / ``candidate_cut`` / ``draw.kept_cdf``, bit for
    bit.
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
    return CandidateTables(fits, n, tau, table[:, -1], key[r, order], table)
