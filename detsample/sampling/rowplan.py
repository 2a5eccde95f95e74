"""Which rows take which path through the Sampler, derived once per batch composition.

A :class:`RowPlan` is a pure function of the rows' :class:`~detsample.params.SamplingParams`
(and the Sampler's ``filter_impl``): greedy and sampling rows, the filter route of each
sampling row, the rows of each ``logprobs_mode`` and of top logprobs, with their row-index
tensors and gathered per-row parameters already on the batch's device. ``SamplingBatch``
caches it until the next ``filter`` / ``merge`` (:meth:`SamplingBatch.derived`), so a
decode step spends no Python loop over rows on it.

A plan chooses how work is done, never what any row's result is: every route gives the
same bits (tests/test_sampler.py proves each route equal to the full sort and each
homogeneous-batch shortcut equal to the general path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from detsample import rules
from detsample.ops.host import host_tensor
from detsample.params import PROCESSED_MODES

#: a top-k small enough for bounded ``topk`` candidates: ``top_k * CANDIDATE_RATIO <= V``
CANDIDATE_RATIO = 8


@dataclass(frozen=True)
class Rows:
    """A subset of a batch's rows: host list, (n,) int64 index tensor, and whether it is
    every row of the batch in order (then gathers can be skipped). A filter route's rows
    also carry their filter parameters, gathered once: ``filters`` = (top_ks (n,) int32,
    top_ps (n,) float64, element (n, F) float32 the element-wise filters'), and which
    filters some row of the group uses: ``active`` = (top-k < V, top-p < 1, an
    element-wise filter off its neutral value)."""

    rows: tuple[int, ...]
    index: torch.Tensor
    every: bool
    filters: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    active: tuple[bool, bool, bool] = (False, False, False)

    @property
    def any_top_k(self) -> bool:
        return self.active[0]

    @staticmethod
    def of(
        rows: Sequence[int],
        B: int,
        device: torch.device,
        filters: tuple[torch.Tensor, ...] | None = None,
        active: tuple[bool, bool, bool] = (False, False, False),
    ) -> Rows:
        rows = tuple(rows)
        index = host_tensor(list(rows), torch.int64, device)
        every = rows == tuple(range(B))
        if filters is not None:
            filters = tuple(t if every else t.index_select(0, index) for t in filters)
        return Rows(rows, index, every, filters, active)

    def __bool__(self) -> bool:
        return bool(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` restricted to these rows (``t`` itself when they are every row)."""
        return t if self.every else t.index_select(0, self.index)


@dataclass(frozen=True)
class BoundedFilters:
    """The bounded rows' filters, shaped once for
    :class:`~detsample.ops.filters.CandidateCut` (n rows).

    ``k_index``: (n, 1) int64 ``min(top_k, k_max) - 1`` (0 on other rows), None when no
    row has a small top-k; ``small``: (n, 1) bool the rows with a small top-k (their
    survivors fit in the candidates), None when all rows or none have one; ``wide``:
    (m,) int64 positions of the other rows (a top-p without a small top-k: their top-k
    threshold and survivors' mass come from the full row), None when there is none;
    ``wide_k``: some of those has a (large) top-k; ``top_p``: (n, 1) float64 with
    ``+inf`` where disabled, None when no row uses top-p; ``element``: (n, F) float32
    the element-wise filters' parameters, None when no row uses one.
    """

    k_index: torch.Tensor | None
    small: torch.Tensor | None
    wide: torch.Tensor | None
    wide_k: bool
    top_p: torch.Tensor | None
    element: torch.Tensor | None

    @staticmethod
    def of(rows: Rows, small: Sequence[bool], k_max: int, V: int) -> BoundedFilters | None:
        if not rows:
            return None
        top_ks, top_ps, element = rows.filters
        _, use_p, use_e = rows.active
        dev = top_ks.device
        k_index = small_t = wide = None
        if any(small):
            k_index = top_ks.to(torch.int64).clamp(1, k_max).sub(1).unsqueeze(1)
            if not all(small):
                small_t = host_tensor(list(small), torch.bool, dev).unsqueeze(1)
        wide_pos = [i for i, s in enumerate(small) if not s]
        if wide_pos:
            wide = host_tensor(wide_pos, torch.int64, dev)
        wide_k = wide is not None and bool((top_ks.index_select(0, wide) < V).any())
        tp = torch.where(top_ps >= 1.0, torch.full_like(top_ps, float("inf")), top_ps)
        return BoundedFilters(
            k_index, small_t, wide, wide_k, tp.unsqueeze(1) if use_p else None, element if use_e else None
        )


@dataclass(frozen=True)
class FilterRoute:
    """Sampling rows by the strategy of step 8 that finds their kept set (all give the
    same bits):

    ``bounded``: rows whose kept set is looked for among candidates
    (:mod:`detsample.sampling.keptset`): a small top-k (``top_k * CANDIDATE_RATIO <=
    V``; a ``topk`` of ``k_max + 1``, grown while a tie group may spill) or a top-p (the
    elements above a bound of its threshold), with ``filters`` their
    :class:`BoundedFilters`;
    ``top_k_only``: a large top-k without top-p: the threshold is the k-th largest
    value, found by selection;
    ``sort``: rows with a top-k or top-p that take the full stable sort (``filter_impl
    ="sort"``);
    ``plain``: rows without top-k / top-p (the element-wise filters alone are value
    rules, no sort).
    """

    bounded: Rows
    k_max: int
    top_k_only: Rows
    sort: Rows
    plain: Rows
    filters: BoundedFilters | None = None  # of ``bounded``


@dataclass(frozen=True)
class RowPlan:
    """The per-composition routing of one batch; see the module docstring."""

    size: int
    greedy: Rows  # temperature 0 or top_k 1
    sampling: Rows  # every other row
    route: FilterRoute  # of the sampling rows
    modes: dict[str, Rows]  # logprobs_mode -> rows, modes in sorted order
    top: dict[str, Rows]  # logprobs_mode -> rows asking logprobs=n > 0
    max_top: int  # the largest ``logprobs`` of any row (0: no top logprobs)
    want_top: torch.Tensor  # (B,) int64 each row's ``logprobs``
    temperatures: torch.Tensor  # (B, 1) float32, 1 on greedy rows (the "scaled" rule)
    argmax: Rows  # rows needing their argmax: greedy rows, or every row when
    #                          "processed" logprobs are asked (one-hot on greedy rows)
    any_element: bool  # some sampling row uses an element-wise filter
    untouched: bool  # no row uses a per-request processor, penalties,
    #                          min_new_tokens, allowed ids, bad words, a grammar or a bias
    excluded: frozenset[int] = field(default=frozenset())  # rows left out (no valid token)

    @property
    def any_processed(self) -> bool:
        """Whether some row asks a processed mode (step 8's kept sets are then needed,
        and every row's argmax: processed logprobs are one-hot on greedy rows)."""
        return any(m in self.modes for m in PROCESSED_MODES)

    @property
    def needs_scaled(self) -> bool:
        """Whether step 7's scaled logits are needed by some row."""
        return bool(self.sampling) or "scaled" in self.modes or self.any_processed


def route(
    params: Sequence,
    rows: Sequence[int],
    vocab_size: int,
    filter_impl: str,
    device: torch.device,
    filters: tuple[torch.Tensor, ...],
) -> FilterRoute:
    """Split sampling ``rows`` into the :class:`FilterRoute` groups, from each row's OWN
    parameters (never its neighbours'). ``filters``: the batch's (top_ks, top_ps,
    element_filters) row tensors, gathered per group."""
    V, B = vocab_size, len(params)
    bounded, small, top_k_only, sort_rows, plain = [], [], [], [], []
    k_max = 0
    for r in rows:
        p = params[r]
        has_k = p.top_k != -1 and p.top_k < V
        has_p = p.top_p < 1.0
        if not (has_k or has_p):
            plain.append(r)
        elif filter_impl != "auto":
            sort_rows.append(r)
        elif has_p or p.top_k * CANDIDATE_RATIO <= V:
            bounded.append(r)
            small.append(has_k and p.top_k * CANDIDATE_RATIO <= V)
            k_max = max(k_max, p.top_k if small[-1] else 0)
        else:
            top_k_only.append(r)

    def group(g: list[int]) -> Rows:
        return Rows.of(
            g,
            B,
            device,
            filters,
            (
                any(params[r].top_k != -1 and params[r].top_k < V for r in g),
                any(params[r].top_p < 1.0 for r in g),
                any(rules.element_in_use(params[r]) for r in g),
            ),
        )

    b = group(bounded)
    return FilterRoute(
        b, k_max, group(top_k_only), group(sort_rows), group(plain), BoundedFilters.of(b, small, k_max, V)
    )


def plan_rows(
    params: Sequence,
    vocab_size: int,
    filter_impl: str,
    device: torch.device,
    *,
    temperatures: torch.Tensor,
    greedy: torch.Tensor,
    filters: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    excluded: frozenset[int] = frozenset(),
) -> RowPlan:
    """The :class:`RowPlan` of rows with ``params``; ``excluded`` rows (no admissible
    token this step) are left out of the sampling and top-logprob rows.

    temperatures: (B, 1) float32, greedy: (B,) bool and filters: (top_ks, top_ps,
    element_filters), the batch's row tensors.
    """
    B = len(params)
    greedy_rows = [i for i, p in enumerate(params) if p.is_greedy]
    sampling = [i for i, p in enumerate(params) if not p.is_greedy and i not in excluded]
    modes: dict[str, list[int]] = {}
    top: dict[str, list[int]] = {}
    for i, p in enumerate(params):
        modes.setdefault(p.logprobs_mode, []).append(i)
        if p.logprobs > 0 and i not in excluded:
            top.setdefault(p.logprobs_mode, []).append(i)
    want = [0 if i in excluded else p.logprobs for i, p in enumerate(params)]
    max_top = max((p.logprobs for p in params), default=0)  # the output's width: every row
    t_eff = torch.where(greedy.unsqueeze(1), torch.ones_like(temperatures), temperatures)
    processed = any(m in modes for m in PROCESSED_MODES)
    return RowPlan(
        size=B,
        greedy=Rows.of(greedy_rows, B, device),
        sampling=Rows.of(sampling, B, device),
        route=route(params, sampling, vocab_size, filter_impl, device, filters),
        modes={m: Rows.of(modes[m], B, device) for m in sorted(modes)},
        top={m: Rows.of(top[m], B, device) for m in sorted(top)},
        max_top=max_top,
        want_top=host_tensor(want, torch.int64, device),
        temperatures=t_eff,
        argmax=Rows.of(range(B) if processed else greedy_rows, B, device),
        any_element=any(rules.element_in_use(params[i]) for i in sampling),
        untouched=not any(
            p.logits_processor is not None
            or p.has_penalties
            or p.min_new_tokens > 0
            or p.allowed_token_ids is not None
            or p.bad_words
            or p.logit_bias
            or p.grammar is not None
            for p in params
        ),
        excluded=frozenset(excluded),
    )
