"""Pipeline step 8: top-k, top-p and the element-wise filters (min-p), with value semantics.

All filters are decided by VALUES, never by positions in a sort, so the kept set
of a row is always ``{i : z_i >= tau}`` for a per-row threshold ``tau`` (whole tie groups
are kept or dropped together). That is what lets a bounded ``topk`` give exactly the bits
of the full stable sort: both see the same descending sequence of values.

Probability mass is measured in exact fixed point: ``q_i = trunc(exp(z_i) * 2**F)``
(int64, ``F = frac_bits(V)``; every rule is defined in :mod:`detsample.rules`), where
``z = (x - max) / T`` so ``exp(z) <= 1`` and the most
probable token has ``q = 2**F``. Sums of ``q`` are exact integers, hence independent of
summation order, blocking, thread count or device.

Semantics on the sorted-descending values ``s`` of a row (the specification, mirrored by
``oracles/sampler.py``):

* top-k: keep ``s_i >= s_{k-1}`` (ties at the boundary kept); ``k = min(top_k, V)``.
* top-p, on the top-k survivors: ``Z = sum q``; ``above_i`` = sum of ``q_j`` with
  ``s_j > s_i``; keep when ``float64(above_i) < top_p * float64(Z)``. ``top_p == 1``
  disables it.
* the element-wise filters of :data:`detsample.rules.ELEMENT_FILTERS`, each keeping
  ``s_i`` by its own test of ``exp(s_i)`` and the row's parameter (min-p: ``exp(s_i) >=
  float32(min-p)``; ``exp(s_max) == 1``, so this is ``p_i >= min-p * p_max`` on any
  renormalisation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from detsample import arith, rules
from detsample.ops import select
from detsample.ops.temperature import scale_logits


@dataclass(frozen=True)
class CandidateCut:
    """The filters of n rows cut on candidates (:func:`kept_prefix`).

    k_index: (n, 1) int64, the top-k boundary's position among the candidates of the rows
    whose top-k survivors are all candidates (``min(top_k, K) - 1``), or None (no such
    row); small: (n, 1) bool, which rows those are, or None (all of them when
    ``k_index`` is given, else none); thr: (n, 1) float32 top-k threshold VALUE of the
    other rows (found over the full row, ``-inf`` without a top-k), or None (no such row);
    total: (n, 1) int64 exact mass of the other rows' top-k survivors over the FULL row
    (:func:`survivor_mass`), or None (every survivor is a candidate: summed there);
    top_p: (n, 1) float64, ``+inf`` (or ``>= 1``) where disabled, or None (no row);
    element: (n, F) float32 the element-wise filters' parameters
    (:data:`detsample.rules.ELEMENT_FILTERS`), or None (no row uses one)."""

    k_index: torch.Tensor | None = None
    small: torch.Tensor | None = None
    thr: torch.Tensor | None = None
    total: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    element: torch.Tensor | None = None

    def rows(self, sel: torch.Tensor) -> CandidateCut:
        """The cut of the rows at positions ``sel`` (m,)."""
        return CandidateCut(
            *(
                None if t is None else t[sel]
                for t in (self.k_index, self.small, self.thr, self.total, self.top_p, self.element)
            )
        )


def kept_prefix(
    vals: torch.Tensor, cut: CandidateCut, frac: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """THE kept set of candidates: top-k, top-p and the element-wise filters by value on a
    candidate set.

    vals: (rows, K) float32 scaled logits sorted descending, every value above a
    candidate being a candidate (a ``topk``); with no top-k and no top-p (``cut.k_index``,
    ``cut.thr`` and ``cut.top_p`` None) any order (a grammar row's allowed columns).
    Returns ``(n, kept, q, thr)``: (rows,) int64 the kept count, (rows, K) bool the kept
    mask (the first ``n`` candidates: each filter keeps an upper set of values), (rows, K)
    int64 every candidate's fixed-point mass, and (rows, 1) float32 the top-k threshold
    value used (None: no top-k). The top-p rule is :func:`top_p_cut`'s. Depends only on
    the values, not on the order of equal values: bitwise the full sort's prefix when
    the prefix ends inside the candidates (the caller checks, see
    ``sampling.keptset``)."""
    e = arith.exp(vals)
    q = rules.mass(e, frac)
    thr = cut.thr
    if cut.k_index is not None:
        tk = vals.gather(1, cut.k_index)
        thr = tk if cut.small is None else torch.where(cut.small, tk, thr)
    kept = vals >= thr if thr is not None else None
    if cut.top_p is not None:
        qk = q * kept if kept is not None else q
        total = cut.total
        if total is None or cut.small is not None:
            here = qk.sum(-1, keepdim=True)
            total = here if total is None else torch.where(cut.small, here, total)
        keep_p = vals >= top_p_cut(vals, qk, rules.top_p_limit(cut.top_p, total))
        kept = keep_p if kept is None else kept.logical_and_(keep_p)
    if cut.element is not None:
        by_value = rules.element_keeps(e, cut.element)
        kept = by_value if kept is None else kept.logical_and_(by_value)
    if kept is None:
        kept = torch.ones_like(vals, dtype=torch.bool)
    return kept.sum(-1), kept, q, thr


def kept_prefix_length(
    sorted_z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor | None, element: torch.Tensor | None, frac: int
) -> torch.Tensor:
    """Length of the kept prefix of each row of ``sorted_z`` (:func:`kept_prefix` of the
    full sorted row, or of candidates holding every top-k survivor).

    sorted_z: (rows, K) float32, each row sorted descending; top_k: (rows,) int, 1 <=
    top_k <= K; top_p: (rows,) float64; element: (rows, F) float32 the element-wise
    filters' parameters; None for either when no row uses that filter. Returns (rows,) int64 in [1, K]."""
    K = sorted_z.shape[-1]
    k = top_k.to(torch.int64).clamp(1, K).unsqueeze(1)
    cut = CandidateCut(
        k_index=k - 1,
        top_p=None if top_p is None else top_p.to(torch.float64).unsqueeze(1),
        element=None if element is None else element.to(torch.float32),
    )
    return kept_prefix(sorted_z, cut, frac)[0]


def passing_prefix(above: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """THE kept-prefix search of top-p: the length of the prefix of ``above`` (rows, n)
    int64 masses strictly above a value, non-decreasing along a row, that passes
    ``float64(above) < limit`` (:func:`detsample.rules.top_p_keeps`); limit broadcastable
    to ``above``. Returns (rows,) int64. Since ``above`` never decreases, the passing
    entries are a prefix and their count is its length. Every torch caller (the sorted
    rows, the candidates, the radix select's bins) counts here."""
    return rules.top_p_keeps(above, limit).sum(-1)


def top_p_cut(sorted_z: torch.Tensor, q: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """(rows, 1) the smallest value top-p keeps in descending ``sorted_z`` (rows, K) with
    masses ``q`` (rows, K) int64 (0 off the top-k survivors) and limit (rows, 1) float64
    ``top_p * Z`` (:func:`detsample.rules.top_p_limit`; ``sorted_z`` holds every value
    above its last entry). The rule keeps ``s_i`` when the mass strictly above its value
    is below the limit; that mass is the exclusive running sum at the start of ``s_i``'s
    tie group, and the exclusive running sum never decreases, so the positions where it
    passes are a prefix of length ``c`` (``c >= 1``: ``excl_0 = 0`` passes) and ``s_i``
    is kept exactly when its group starts inside it: ``s_i >= s_{c-1}``. No tie-group
    bookkeeping is needed; the float64 roundings are those of the rule."""
    c = passing_prefix(q.cumsum(-1).sub_(q), limit)
    return sorted_z.gather(1, (c - 1).unsqueeze(1))


def thresholds_by_sort(
    z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, element: torch.Tensor, frac: int
) -> torch.Tensor:
    """Reference semantics ("full-sort top-k"): per-row threshold tau from a full
    stable descending sort. z: (rows, V) float32, top_k: (rows,) int, top_p: (rows,)
    float64, element: (rows, F) float32 -> (rows,) float32; kept = z >= tau."""
    sz, _ = torch.sort(z, dim=-1, descending=True, stable=True)
    n = kept_prefix_length(sz, top_k, top_p, element, frac)
    return sz.gather(1, (n - 1).unsqueeze(1)).squeeze(1)


def logit_topk(
    x: torch.Tensor, row_max: torch.Tensor, temperatures: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``min(k, V)`` largest scaled logits ``z = scale_logits(x, row_max, T)`` of
    each row (:mod:`detsample.ops.temperature`), descending, and their ids, without
    computing ``z`` over the vocabulary.

    x: (rows, V) float32 logits; row_max: (rows, 1) float32 finite; temperatures: (rows,
    1) float32 > 0. The ``topk`` is taken over ``x`` and only the candidates are scaled:
    ``z = (x - m) / T`` is monotone (non-decreasing) in ``x``, so the k largest ``x``
    carry the k largest ``z`` values, and element-wise IEEE operations give each
    candidate the bits it has in ``z``. Returns the values of a ``topk`` of ``z``, bit for
    bit, and the same ids up to the order inside a group of equal values (every consumer
    reads whole tie groups: :func:`kept_prefix`, ``draw.id_order_cdf``)."""
    vals, ids = select.topk(x, k)
    return scale_logits(vals, row_max, temperatures), ids


def topk_threshold(z: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """The top-k threshold VALUE of each row: its k-th largest value, ``-inf`` where
    ``top_k >= V`` (top-k disabled). z: (rows, V) float32; top_k: (rows,) int. Returns
    (rows,) float32; the top-k survivors are ``z >= threshold`` (ties kept). A selection
    (``kthvalue``) per distinct k, never a sort; the value does not depend on how ties
    are ordered."""
    rows, V = z.shape
    out = torch.full((rows,), float("-inf"), dtype=z.dtype, device=z.device)
    ks = top_k.to(torch.int64)
    for k in sorted(set(ks.tolist())):
        if k >= V:
            continue
        sel = (ks == k).nonzero().flatten()
        out[sel] = torch.kthvalue(z.index_select(0, sel), V - k + 1, dim=-1).values
    return out


def survivor_mass(
    z: torch.Tensor,
    thr: torch.Tensor | None,
    frac: int,
    *,
    out: torch.Tensor | None = None,
    q_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact fixed-point mass of the top-k survivors: ``sum(q_i for z_i >= thr)``.

    z: (rows, V) float32 scaled logits (row max 0); thr: (rows,) float32 (``-inf``: every
    token) or None (no row has a top-k); ``out`` / ``q_out``: optional (rows, V) float32 /
    int64 scratch (reused buffers spare the page faults of fresh (rows, V) tensors).
    Returns (rows,) int64, the ``total`` of :func:`kept_prefix_length` over the full
    sorted row, bit for bit (an exact integer sum; ``exp`` is fed
    ``max(z, rules.EXP_FLOOR)``, which changes no mass)."""
    cut = thr is not None and bool(torch.isfinite(thr).any())
    return rules.cut_masses(z, frac, tau=thr if cut else None, want_q=False, out=out, q_out=q_out)[1].squeeze(1)
