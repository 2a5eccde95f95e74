"""Pipeline steps 6 and 9: greedy argmax and the seeded draw.

The draw is the exact inverse-CDF method of docs/sampling.md step 9, one uniform per row:
over the kept tokens **in token-id order**, with exact fixed-point masses ``q`` (see
:mod:`detsample.ops.filters`), ``Q = sum q``, ``t = floor(u * float64(Q))`` (at most
``Q - 1``) and the chosen token is the first id whose running sum of ``q`` exceeds ``t``.
``u`` is keyed only by ``(seed, position)`` (:func:`detsample.rng.row_uniforms`), and the
order of the CDF is the token-id order, so the result never depends on a sorted rank,
a row index or the batch size. All sums are exact integers, so the compact path (kept
ids only) and the full-vocabulary path return the same token, bit for bit.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from detsample import arith, rules
from detsample.ops import rowpass

#: block width of the two-level search of the full-vocabulary path
BLOCK = 1024


def greedy_argmax(x: torch.Tensor) -> torch.Tensor:
    """x: (batch, vocab) float32 -> (batch,) int64 argmax, ties to the lowest id, NaN
    counted as the largest value (``torch.argmax``'s token, bit for bit).

    CPU tensors take numpy's ``argmax``, which has the same rule (the first index of the
    maximum, the first NaN when there is one) and is vectorised where ``torch.argmax``
    is a scalar loop on the CPU (~10x faster on a 32000-token row); tests/ops/test_draw.py
    keeps the two equal on ties, NaN, infinities, signed zeros and huge magnitudes.
    """
    if x.device.type == "cpu" and not x.requires_grad:
        return torch.from_numpy(x.numpy().argmax(axis=-1))
    return torch.argmax(x, dim=-1)


def greedy_with_logprob(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`greedy_argmax` of x (batch, vocab) float32 and the log_softmax of each row
    at its token (``ops.logprobs.log_softmax(x, at=...)``): ((batch,) int64, (batch,)
    float32), bit for bit the two apart; on CPU tensors one fused numba pass per row
    (``arith.greedy``: the maximum found once for both)."""
    got = arith.greedy(x)
    if got is not None:
        return got
    from detsample.ops import logprobs

    tokens = greedy_argmax(x)
    return tokens, logprobs.log_softmax(x, at=tokens)


def id_order_cdf(ids: torch.Tensor, q: torch.Tensor, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept tokens' CDF in token-id order, from candidates: ids (rows, K) int64,
    their masses q (rows, K) int64 and the kept mask (rows, K) bool (what
    ``filters.kept_prefix`` returns). Returns ``(sorted_ids, csum)``, both (rows, K): the
    kept ids ascending (then ``rules.PAD_ID``, larger than any token) and the running
    int64 sum of their masses; ``csum[:, -1]`` is the exact kept mass ``Q`` of the row."""
    key = torch.where(kept, ids, rules.PAD_ID)
    sorted_ids, order = torch.sort(key, dim=-1)
    return sorted_ids, (q * kept).gather(1, order).cumsum_(-1)


def draw_by_cdf(sorted_ids: torch.Tensor, csum: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse CDF over :func:`id_order_cdf`'s table: (rows,) int64 tokens for uniforms
    ``u`` (rows,) float64 in (0, 1)."""
    t = rules.draw_target(u, csum[:, -1])
    return sorted_ids.gather(1, rules.first_above(csum, t.unsqueeze(1))).squeeze(1)


def kept_mass(
    z: torch.Tensor,
    tau: torch.Tensor,
    element: torch.Tensor,
    frac: int,
    *,
    out: torch.Tensor | None = None,
    q_out: torch.Tensor | None = None,
    cut_tau: bool | None = None,
    cut_element: bool | None = None,
) -> torch.Tensor:
    """Fixed-point masses of the kept tokens (:func:`detsample.rules.mass`), zero elsewhere.

    z: (rows, V) float32 scaled logits (row max exactly 0); tau: (rows,) float32 kept
    threshold (``-inf`` keeps everything); element: (rows, F) float32 the element-wise
    filters' parameters (:data:`detsample.rules.ELEMENT_FILTERS`). kept = ``(z >= tau) &
    rules.element_keeps(exp(z), element)``. Returns (rows, V) int64 ``q`` (into ``q_out``
    when given; ``out``: a (rows, V) float32 scratch for ``exp``, which may be ``z``
    itself: preallocated buffers avoid the page faults of fresh (rows, V) tensors).
    ``cut_tau`` / ``cut_element``: whether some ``tau`` is finite / some element-wise
    filter active, when the caller knows (None: look; a wrong False would keep too much,
    so only pass what holds).
    """
    return kept_masses(z, tau, element, frac, out=out, q_out=q_out, cut_tau=cut_tau, cut_element=cut_element)[0]


def kept_masses(
    z: torch.Tensor,
    tau: torch.Tensor,
    element: torch.Tensor,
    frac: int,
    *,
    out: torch.Tensor | None = None,
    q_out: torch.Tensor | None = None,
    cut_tau: bool | None = None,
    cut_element: bool | None = None,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`kept_mass` and the exact sums of the masses by blocks of ``block`` columns
    (None: the whole row): ``(q, sums)``, sums (rows, nb) int64. One fused pass on a CPU
    (:func:`detsample.rules.cut_masses`)."""
    cut_tau = bool(torch.isfinite(tau).any()) if cut_tau is None else cut_tau
    if cut_element is None:
        cut_element = bool(rules.element_active(element).any())
    least = least_kept(element) if cut_element else None
    if cut_element and least is None:  # a registered filter without a least kept exp
        w = rules.floored_exp(z, out=out, keep_from=tau if cut_tau else None)
        w.masked_fill_(rules.element_keeps(w, element).logical_not_(), 0.0)
        q = rules.mass_in_place(w, frac, q_out)
        return q, rules.block_sums(q, block)
    # (tau's cut made on the values, before the exp)
    return rules.cut_masses(z, frac, tau=tau if cut_tau else None, least=least, block=block, out=out, q_out=q_out)


def least_kept(element: torch.Tensor) -> torch.Tensor | None:
    """(rows,) float32: the smallest exp every element-wise filter keeps (-inf where all
    are neutral), or None when some registered filter has no ``least``."""
    if not all(f.least is not None for f in rules.ELEMENT_FILTERS):
        return None
    out = [-math.inf] * element.shape[0]
    for j, f in enumerate(rules.ELEMENT_FILTERS):
        for r, v in enumerate(element[:, j].tolist()):
            if v != f.neutral:
                out[r] = max(out[r], f.least(v))
    return torch.tensor(out, dtype=torch.float32, device=element.device)


def block_cdf(
    z: torch.Tensor,
    tau: torch.Tensor,
    element: torch.Tensor,
    frac: int,
    *,
    out: torch.Tensor | None = None,
    q_out: torch.Tensor | None = None,
    cut_tau: bool | None = None,
    cut_element: bool | None = None,
    lazy: bool = False,
) -> tuple[torch.Tensor | rowpass.LazyMasses, torch.Tensor]:
    """The kept tokens' masses over the whole vocabulary and their blocked CDF.

    z: (rows, V) float32; tau: (rows,) float32; element: (rows, F) float32; kept as in
    :func:`kept_mass`; ``out`` / ``q_out``: optional (rows, V) float32 / int64 scratch;
    ``cut_tau`` / ``cut_element`` as in :func:`kept_mass`. Returns
    ``(q, bsum)``: (rows, V) int64 masses (0 off the kept set) and (rows, nb) int64
    running sums of blocks of BLOCK tokens (the last block may be
    shorter); ``bsum[:, -1]`` is the exact kept mass ``Q``. Exact integer sums make the
    blocking and the summing order irrelevant to every result. ``lazy``: where the masses
    are one fused CPU pass, ``q`` is not materialised but a
    :class:`~detsample.ops.rowpass.LazyMasses` (the draw recomputes one block per row;
    :func:`draw_by_blocks` takes either; ``z`` must then stay unchanged until the draw).
    """
    lazy = _lazy(z, tau, element, cut_tau, cut_element) if lazy else None
    if lazy is not None:
        sums = rules.cut_masses(z, frac, tau=lazy.tau, least=lazy.least, block=BLOCK, want_q=False)[1]
        return rowpass.LazyMasses(z, lazy.tau, lazy.least, frac), sums.cumsum(-1)
    q, sums = kept_masses(
        z, tau, element, frac, out=out, q_out=q_out, cut_tau=cut_tau, cut_element=cut_element, block=BLOCK
    )
    return q, sums.cumsum(-1)


def _lazy(
    z: torch.Tensor, tau: torch.Tensor, element: torch.Tensor, cut_tau: bool | None, cut_element: bool | None
) -> rowpass.LazyMasses | None:
    """The cuts of a blocked table whose masses need not be materialised (a fused CPU
    pass, every element-wise filter with a ``least``; ``z`` contiguous), as a
    LazyMasses without ``z`` and ``frac``; else None."""
    if not (rules.fused_masses(z) and z.is_contiguous()):
        return None
    cut_element = bool(rules.element_active(element).any()) if cut_element is None else cut_element
    least = least_kept(element) if cut_element else None
    if cut_element and least is None:
        return None
    inf = torch.full((z.shape[0],), -math.inf)
    t = tau.to(torch.float32) if (cut_tau is None or cut_tau) else inf
    return rowpass.LazyMasses(None, t.contiguous(), inf if least is None else least, 0)


def draw_by_blocks(q: torch.Tensor | rowpass.LazyMasses, bsum: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse CDF over :func:`block_cdf`'s table, in two levels: the block, then a cumsum
    inside it. u: (rows,) float64 in (0, 1) -> (rows,) int64 tokens. Lazy masses: the
    same two levels in one numba pass per row, recomputing the block's masses.

    The last block may be shorter than BLOCK: its missing entries read the last token's
    mass again, which only raises the running sum after every real entry, and the target
    lies below the block's real total, so the search never lands on them.
    """
    if isinstance(q, rowpass.LazyMasses):
        return rowpass.draw_blocks(q, bsum, rules.draw_target(u, bsum[:, -1]), BLOCK)
    V = q.shape[-1]
    t = rules.draw_target(u, bsum[:, -1]).unsqueeze(1)
    blk = rules.first_above(bsum, t)
    base = F.pad(bsum, (1, 0)).gather(1, blk)  # mass of the blocks before ``blk``
    start = blk * BLOCK
    idx = torch.arange(BLOCK, device=q.device).unsqueeze(0).add(start).clamp_(max=V - 1)
    inner = q.gather(1, idx).cumsum_(-1).add_(base)
    return (start + rules.first_above(inner, t)).squeeze(1)
