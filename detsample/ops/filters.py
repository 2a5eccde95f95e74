"""Pipeline step 8: top-k, top-p and min-p, with value semantics.

All three filters are decided by VALUES, never by positions in a sort, so the kept set
of a row is always ``{i : z_i >= tau}`` for a per-row threshold ``tau`` (whole tie groups
are kept or dropped together). That is what lets a bounded ``topk`` give exactly the bits
of the full stable sort: both see the same descending sequence of values.

Probability mass is measured in exact fixed point: ``q_i = trunc(exp(z_i) * 2**F)``
(int64, ``F = frac_bits(V)``; every rule is defined in :mod:`detsample.rules`), where ``z = (x - max) / T`` so ``exp(z) <= 1`` and the most
probable token has ``q = 2**F``. Sums of ``q`` are exact integers, hence independent of
summation order, blocking, thread count or device.

Semantics on the sorted-descending values ``s`` of a row (the specification, mirrored by
``oracles/sampler.py``):

* top-k: keep ``s_i >= s_{k-1}`` (ties at the boundary kept); ``k = min(top_k, V)``.
* top-p, on the top-k survivors: ``Z = sum q``; ``above_i`` = sum of ``q_j`` with
  ``s_j > s_i``; keep when ``float64(above_i) < top_p * float64(Z)``. ``top_p == 1``
  disables it.
* min-p: keep ``exp(s_i) >= float32(min_p)`` (``exp(s_max) == 1``, so this is
  ``p_i >= min_p * p_max`` on any renormalisation).
"""

from __future__ import annotations

import torch

from detsample import rules
from detsample.ops.temperature import scale_logits


def kept_prefix_length(sorted_z: torch.Tensor, top_k: torch.Tensor,
                       top_p: torch.Tensor | None, min_p: torch.Tensor | None,
                       frac: int) -> torch.Tensor:
    """Length of the kept prefix of each row of ``sorted_z``.

    sorted_z: (rows, K) float32, each row sorted descending, holding at least every
    top-k survivor of the row (the full row, or a ``topk`` candidate set containing all
    values ``>= s_{k-1}``). top_k: (rows,) int, 1 <= top_k <= K; top_p: (rows,) float64;
    min_p: (rows,) float32; None for either when no row uses that filter (the same result
    with fewer operations). Returns (rows,) int64 in [1, K]. Depends only on the values,
    not on the order of equal values: bitwise the same for a full sort and a topk.
    """
    K = sorted_z.shape[-1]
    k = top_k.to(torch.int64).clamp(1, K).unsqueeze(1)
    thr = sorted_z.gather(1, k - 1)
    return _prefix(sorted_z, thr, None, top_p, min_p, frac)


def _prefix(sorted_z: torch.Tensor, thr: torch.Tensor, total: torch.Tensor | None,
            top_p: torch.Tensor | None, min_p: torch.Tensor | None, frac: int) -> torch.Tensor:
    """Kept prefix length of descending ``sorted_z`` (rows, K) given the top-k threshold
    value ``thr`` (rows, 1) and the top-k survivors' exact mass ``total`` (rows, 1)
    int64 (None: the survivors are all in ``sorted_z``, sum them). One rule for every
    caller, so every path computes the same bits. ``top_p`` / ``min_p`` None: no row
    uses that filter (``top_p == 1`` keeps everything, and so does ``exp(z) >= 0``)."""
    kept = sorted_z >= thr
    e = torch.exp(sorted_z) if top_p is not None or min_p is not None else None
    if top_p is not None:
        q = rules.mass(e, frac) * kept
        if total is None:
            total = q.sum(-1, keepdim=True)
        kept &= sorted_z >= top_p_cut(sorted_z, q, rules.top_p_limit(top_p.unsqueeze(1), total))
    if min_p is not None:
        kept &= rules.min_p_keeps(e, min_p.to(torch.float32).unsqueeze(1))
    return kept.sum(-1)


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


def thresholds_by_sort(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                       min_p: torch.Tensor, frac: int) -> torch.Tensor:
    """Reference semantics ("full-sort top-k"): per-row threshold tau from a full
    stable descending sort. z: (rows, V) float32 -> (rows,) float32; kept = z >= tau."""
    sz, _ = torch.sort(z, dim=-1, descending=True, stable=True)
    n = kept_prefix_length(sz, top_k, top_p, min_p, frac)
    return sz.gather(1, (n - 1).unsqueeze(1)).squeeze(1)


def candidate_cut(vals: torch.Tensor, k_index: torch.Tensor, cut_k: bool,
                  top_p: torch.Tensor | None, min_p: torch.Tensor | None, frac: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k, top-p and min-p on a candidate set holding every top-k survivor, in few
    operations: :func:`kept_prefix_length`'s ``n``, bit for bit, with the kept mask and
    the candidates' masses for the draw's table (``draw.kept_cdf``).

    vals: (rows, K) float32 scaled logits sorted descending, every top-k survivor among
    them (:func:`cut_candidates` with ``fits``); k_index: (rows, 1) int64, ``min(top_k,
    K) - 1``; cut_k: whether some row's top-k is below K (else all K candidates survive
    it); top_p: (rows, 1) float64, ``+inf`` where disabled, or None (no row); min_p:
    (rows, 1) float32 or None. Returns ``(n (rows,) int64, kept (rows, K) bool, q (rows,
    K) int64)``: kept = the first ``n`` candidates, q = every candidate's fixed-point mass.

    The top-p rule is :func:`top_p_cut`'s.
    """
    e = torch.exp(vals)
    q = rules.mass(e, frac)
    kept = vals >= vals.gather(1, k_index) if cut_k else None
    if top_p is not None:
        qk = q * kept if kept is not None else q
        limit = rules.top_p_limit(top_p, qk.sum(-1, keepdim=True))
        keep_p = vals >= top_p_cut(vals, qk, limit)
        kept = keep_p if kept is None else kept.logical_and_(keep_p)
    if min_p is not None:
        above = rules.min_p_keeps(e, min_p)
        kept = above if kept is None else kept.logical_and_(above)
    if kept is None:
        kept = torch.ones_like(vals, dtype=torch.bool)
    return kept.sum(-1), kept, q


def logit_candidates(x: torch.Tensor, row_max: torch.Tensor, temperatures: torch.Tensor,
                     k_index: torch.Tensor, k_max: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`cut_candidates` of the scaled logits ``z = scale_logits(x, row_max, T)``
    (:mod:`detsample.ops.temperature`) without computing ``z`` over the vocabulary.

    x: (rows, V) float32 logits; row_max: (rows, 1) float32 finite; temperatures:
    (rows, 1) float32 > 0; k_index: (rows, 1) int64 ``min(top_k, k_max) - 1``; k_max as
    there. The ``topk`` is taken over ``x`` and
    only the candidates are scaled: ``z = (x - m) / T`` is monotone (non-decreasing) in
    ``x``, so the k_max + 1 largest ``x`` carry the k_max + 1 largest ``z`` values, and
    element-wise IEEE operations give each candidate the bits it has in ``z``. Returns
    the same ``vals`` and ``fits`` as :func:`cut_candidates` of a ``topk`` of ``z``, bit
    for bit, and
    the same ids up to the order inside a group of equal values (every consumer reads
    whole tie groups: :func:`kept_prefix_length`, ``draw.compact_cdf``).
    """
    vals, ids = logit_topk(x, row_max, temperatures, k_max)
    return cut_candidates(vals, ids, k_index, k_max, x.shape[-1])


def logit_topk(x: torch.Tensor, row_max: torch.Tensor, temperatures: torch.Tensor,
               k_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``min(k_max + 1, V)`` largest scaled logits of each row, descending, and their
    ids (:func:`logit_candidates` before its cut; arguments as there)."""
    vals, ids = torch.topk(x, min(k_max + 1, x.shape[-1]), dim=-1, largest=True, sorted=True)
    return scale_logits(vals, row_max, temperatures), ids


def cut_candidates(vals: torch.Tensor, ids: torch.Tensor, k_index: torch.Tensor, k_max: int,
                   V: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bounded candidates for rows whose top-k survivors fit in ``k_max`` values.

    vals: (rows, K1) the ``K1 = min(k_max + 1, V)`` largest values of each row, sorted
    descending (a ``torch.topk``), ids: their token ids; k_index: (rows, 1) int64
    ``min(top_k, k_max) - 1``; V: the vocabulary size. Returns ``(vals, ids, fits)``: the
    (rows, k_max) candidates and (rows,) bool telling whether every value ``>= s_{k-1}``
    is among them. The extra candidate decides it: the survivors fit iff the
    (k_max+1)-th largest value is below ``s_{k-1}`` (ties at the boundary can exceed
    ``k_max``; such rows must use :func:`thresholds_by_sort`)."""
    thr = vals.gather(1, k_index).squeeze(1)
    if V <= k_max:
        fits = torch.ones_like(thr, dtype=torch.bool)
    else:
        fits = vals[:, k_max] < thr
    return vals[:, :k_max], ids[:, :k_max], fits


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


def survivor_mass(z: torch.Tensor, thr: torch.Tensor | None, frac: int, *,
                  out: torch.Tensor | None = None, q_out: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """Exact fixed-point mass of the top-k survivors: ``sum(q_i for z_i >= thr)``.

    z: (rows, V) float32 scaled logits (row max 0); thr: (rows,) float32 (``-inf``: every
    token) or None (no row has a top-k); ``out`` / ``q_out``: optional (rows, V) float32 /
    int64 scratch (reused buffers spare the page faults of fresh (rows, V) tensors).
    Returns (rows,) int64, the ``total`` of :func:`kept_prefix_length` over the full
    sorted row, bit for bit (an exact integer sum; ``exp`` is fed
    ``max(z, rules.EXP_FLOOR)``, which changes no mass)."""
    w = rules.floored_exp(z, out=out)
    if thr is not None and bool(torch.isfinite(thr).any()):
        w.masked_fill_(z < thr.unsqueeze(1), 0.0)
    return rules.mass_in_place(w, frac, q_out).sum(-1)


def nucleus_prefix(vals: torch.Tensor, thr: torch.Tensor, total: torch.Tensor,
                   top_p: torch.Tensor, min_p: torch.Tensor | None, frac: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k / top-p / min-p on a ``topk`` candidate set, without the rest of the row.

    vals: (rows, K) float32, the K largest values of each row, descending; thr: (rows,)
    top-k threshold value (:func:`topk_threshold`); total: (rows,) int64 exact mass of
    the top-k survivors of the FULL row (:func:`survivor_mass`); top_p (rows,) float64;
    min_p (rows,) float32 or None (no row has min-p). Returns ``(n, decided)``: (rows,) int64 kept prefix length
    and (rows,) bool.

    Every value greater than a candidate is a candidate, so each candidate's "mass
    strictly above" is exact, and the kept set is a prefix (each filter is monotone in
    the value). When the prefix ends inside the candidates (``n < K``) the first dropped
    candidate is strictly below the last kept one and every other token is at most that
    value, so ``n`` and ``vals[n - 1]`` are exactly those of the full sort
    (:func:`thresholds_by_sort`) and every kept token is a candidate. ``decided`` is
    ``n < K`` (or ``K == V``); undecided rows need more candidates.
    """
    K = vals.shape[-1]
    n = _prefix(vals, thr.unsqueeze(1), total.unsqueeze(1), top_p, min_p, frac)
    return n, n < K


def mass_needed_bound(vals: torch.Tensor, total: torch.Tensor, top_p: torch.Tensor,
                      frac: int) -> torch.Tensor:
    """A lower bound on how many more tokens an undecided row's nucleus holds beyond its
    K candidates: the mass still short of ``top_p * total`` divided by the largest mass a
    non-candidate can have (the last candidate's). (rows,) float64; used only to decide
    how far to grow the candidate set, never a result."""
    q = rules.mass(torch.exp(vals), frac)
    short = top_p.to(torch.float64) * total.to(torch.float64) - q.sum(-1).to(torch.float64)
    return short.clamp(min=0) / q[:, -1].clamp(min=1).to(torch.float64)
