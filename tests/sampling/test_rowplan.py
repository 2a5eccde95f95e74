"""detsample/rowplan.py: routing derived once per batch composition, from each row's own
parameters."""

from __future__ import annotations

import torch

from detsample import Request, Sampler, SamplingBatch, SamplingParams
from detsample.sampling.rowplan import plan_rows

V = 400
PARAMS = [
    SamplingParams(temperature=0.0, seed=0),  # greedy
    SamplingParams(temperature=0.7, top_k=20, seed=1),  # candidates
    SamplingParams(temperature=0.7, top_k=200, seed=2),  # large k only
    SamplingParams(temperature=0.7, top_p=0.9, seed=3),  # nucleus
    SamplingParams(
        temperature=0.7,
        min_p=0.1,
        seed=4,
        logprobs=2,  # plain
        logprobs_mode="processed",
    ),
]


def _batch(ps=PARAMS):
    return SamplingBatch.from_requests([Request(str(i), p) for i, p in enumerate(ps)], V)


def _plan(b, impl="auto"):
    return plan_rows(
        b.params,
        V,
        impl,
        b.device,
        temperatures=b.temperatures,
        greedy=b.greedy,
        filters=(b.top_ks, b.top_ps, b.element_filters),
    )


def test_rows_routed_by_their_own_parameters():
    p = _plan(_batch())
    assert p.greedy.rows == (0,) and p.sampling.rows == (1, 2, 3, 4)
    assert p.route.bounded.rows == (1, 3) and p.route.k_max == 20
    assert p.route.top_k_only.rows == (2,)
    assert p.route.bounded.filters[0].tolist() == [20, V] and p.route.bounded.any_top_k
    assert p.route.bounded.filters[1].tolist() == [1.0, 0.9]
    assert p.route.filters.wide.tolist() == [1] and not p.route.filters.wide_k
    assert not p.route.sort and p.route.plain.rows == (4,)
    assert set(p.modes) == {"raw", "processed"} and p.top["processed"].rows == (4,)
    assert p.max_top == 2 and p.want_top.tolist() == [0, 0, 0, 0, 2]
    assert p.temperatures[0, 0] == 1.0 and p.temperatures[1, 0] == torch.tensor(0.7)
    s = _plan(_batch(), "sort")
    assert not s.route.bounded and not s.route.top_k_only and s.route.filters is None
    assert s.route.sort.rows == (1, 2, 3) and s.route.plain.rows == (4,)


def test_excluded_rows_leave_sampling_and_top_rows_but_not_the_width():
    b = _batch()
    p = plan_rows(
        b.params,
        V,
        "auto",
        torch.device("cpu"),
        temperatures=b.temperatures,
        greedy=b.greedy,
        filters=(b.top_ks, b.top_ps, b.element_filters),
        excluded=frozenset({4}),
    )
    assert p.sampling.rows == (1, 2, 3) and "processed" not in p.top and p.max_top == 2


def test_plan_is_derived_once_per_composition():
    """Bug pinned: the routing, the per-mode row lists and their index tensors were
    rebuilt from the parameters (a Python loop over rows) on every ``sample`` call."""
    b, s = _batch(), Sampler()
    x, pos = torch.randn(len(PARAMS), V), torch.arange(len(PARAMS))
    s.sample(x, b, pos)
    first = b.derived(("row_plan", "auto"), lambda: None)
    s.sample(x, b, pos)
    assert b.derived(("row_plan", "auto"), lambda: None) is first
    b.advance(s.sample(x, b, pos).token_ids)  # tokens do not change the plan
    assert b.derived(("row_plan", "auto"), lambda: None) is first
    b.filter([4, 0, 1])
    assert b.derived(("row_plan", "auto"), lambda: "rebuilt") == "rebuilt"
    b.merge(_batch(PARAMS[:1]))
    assert b.derived(("row_plan", "auto"), lambda: "again") == "again"


def test_bounded_filters_shaped_once_per_composition():
    """The bounded rows' filters are gathered and shaped in the plan: the top-k boundary
    index of the small top-k rows, which rows those are (None when all are), the rows
    whose threshold and mass come from the full row (a top-p without a small top-k, with
    or without a large top-k), top_p with +inf where disabled (a row without top-p never
    cuts by mass), the element-wise filters only when a row uses one."""
    ps = [
        SamplingParams(temperature=0.7, top_k=20, seed=1),
        SamplingParams(temperature=0.7, top_k=8, top_p=0.5, seed=2),
        SamplingParams(temperature=0.0, seed=3),
    ]
    bf = _plan(_batch(ps)).route.filters
    assert bf.k_index.tolist() == [[19], [7]] and bf.small is None and bf.wide is None
    assert bf.top_p.tolist() == [[float("inf")], [0.5]] and bf.element is None
    mixed = ps[:2] + [SamplingParams(temperature=0.7, top_k=300, top_p=0.9, min_p=0.1, seed=4)]
    bf = _plan(_batch(mixed)).route.filters
    assert bf.small.flatten().tolist() == [True, True, False] and bf.wide.tolist() == [2]
    assert bf.wide_k and bf.element.flatten().tolist() == [0.0, 0.0, torch.tensor(0.1).item()]
    same = _plan(_batch(ps[:1] * 2)).route.filters
    assert same.top_p is None and same.wide is None
    assert _plan(_batch(ps[2:])).route.filters is None
