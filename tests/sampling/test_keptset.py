"""detsample/sampling/keptset.py: the one kept-set function, its two strategies and the
spill between them, against the full stable sort (bits) and the float64 oracle
(oracles/sampler.py: kept sets away from near-ties)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detsample import Request, Sampler, SamplingBatch, SamplingParams
from detsample.benchmarks.sampler import Case, make_logits
from detsample.sampling import keptset
from oracles import sampler as osamp
from tests.helpers import logits_rows

V = 4096  # V / 8 = 512 candidates at most: small top-k rows fit, nuclei grow (64, 512) or spill
MARGIN = 1e-5
FILTER_MIXES = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.5, 1.0, 1.7]),
    top_k=st.sampled_from([-1, -1, 2, 20, 100, 500, 3000]),
    top_p=st.sampled_from([1.0, 1.0, 0.3, 0.9, 0.999]),
    min_p=st.sampled_from([0.0, 0.0, 0.05, 0.5]),
    seed=st.integers(0, 2**31),
)
FAMILIES = ["random", "ties", "neginf", "huge", "peaked", "bf16", "onehot"]
#: rows every batch holds, one per route: a nucleus alone, small top-k with top-p, a
#: large top-k with top-p and min-p, a small top-k alone, min-p alone
EVERY_ROUTE = [
    SamplingParams(top_p=0.9, temperature=1.3, seed=1),
    SamplingParams(top_k=20, top_p=0.9, seed=2),
    SamplingParams(top_k=3000, top_p=0.95, min_p=0.01, seed=3),
    SamplingParams(top_k=2, seed=4),
    SamplingParams(min_p=0.1, seed=5),
]


#: top-p rows' two candidate routes: by value (group maxima, nucleus.above) from
#: ``BY_VALUE_MIN`` elements on, a grown ``topk`` with the exact mass below it
ROUTES = {"by_value": 0, "topk": 1 << 62}
#: hypothesis examples reuse the route fixture: it only sets a module constant
FIXTURE_OK = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(params=sorted(ROUTES))
def top_p_route(request, monkeypatch):
    """Runs a test under each route of the top-p rows (forced by their size bound)."""
    monkeypatch.setattr(keptset, "BY_VALUE_MIN", ROUTES[request.param])
    return request.param


@pytest.fixture
def by_value(monkeypatch):
    """The top-p rows take their candidates by value whatever their size."""
    monkeypatch.setattr(keptset, "BY_VALUE_MIN", 0)


def _batch(ps, vocab=V):
    return SamplingBatch.from_requests([Request(str(i), p) for i, p in enumerate(ps)], vocab)


def _masks(ps, x, vocab=V):
    """The kept sets of the default Sampler and of the full stable sort."""
    got = Sampler().sampling_mask(torch.from_numpy(x), _batch(ps, vocab))
    return got, Sampler(filter_impl="sort").sampling_mask(torch.from_numpy(x), _batch(ps, vocab))


@FIXTURE_OK
@given(
    st.lists(FILTER_MIXES, min_size=0, max_size=6),
    st.sampled_from(FAMILIES),
    st.integers(0, 2**32 - 1),
    st.randoms(use_true_random=False),
)
def test_kept_sets_equal_the_full_sort(top_p_route, ps, family, seed, order):
    """Random batches mixing small and large top-k, top-p and min-p rows (so the bounded
    strategy, its growth and the spill to the full strategy all run): every row's kept
    set is the full sort's, bit for bit. Bug it would catch: a row decided on candidates
    whose prefix did not end inside them (a kept token missing, or a tie group split)."""
    ps = EVERY_ROUTE + ps
    order.shuffle(ps)
    got, ref = _masks(ps, logits_rows(np.random.default_rng(seed), len(ps), V, family))
    assert torch.equal(got, ref)


VO = 256  # the float64 oracle is quadratic in V


@FIXTURE_OK
@given(st.lists(FILTER_MIXES, min_size=1, max_size=8), st.sampled_from(FAMILIES), st.integers(0, 2**32 - 1))
def test_kept_sets_equal_the_float64_oracle(top_p_route, ps, family, seed):
    """The same mixes on a short vocabulary: every row's kept set is the float64
    oracle's wherever the oracle's decision margin is clear (and the sort's, bit for
    bit, everywhere)."""
    ps = [p.replace(top_k=min(p.top_k, 2 * VO)) for p in ps] + [
        SamplingParams(top_p=0.9, seed=1),
        SamplingParams(top_k=20, top_p=0.8, seed=2),
    ]
    x = logits_rows(np.random.default_rng(seed), len(ps), VO, family)
    got, ref = _masks(ps, x, VO)
    assert torch.equal(got, ref)
    for i, p in enumerate(ps):
        if p.is_greedy:
            continue
        r = osamp.sample_row(
            x[i], osamp.RowParams(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, min_p=p.min_p), 0
        )
        if r.margin > MARGIN:
            assert got[i].nonzero().flatten().tolist() == r.kept, i


@pytest.mark.parametrize(
    "top_k,top_p,spills",
    [
        (2, 1.0, True),  # 1 winner then 63 ties: the tie group spills past k_max + 1
        (-1, 0.5, True),  # a flat nucleus outgrows V / 8 candidates
        (20, 0.9, False),  # a peaked row ends inside its first candidates
    ],
)
def test_a_row_spills_from_bounded_to_full_only_when_undecided(monkeypatch, top_p_route, top_k, top_p, spills):
    """The only hand-off: a row the bounded strategy cannot decide goes to the full
    strategy (spied), and keeps the sort's bits there."""
    x = torch.zeros(1, V)
    if spills and top_k == 2:
        x[0, 0] = 5.0
    elif not spills:
        x = torch.from_numpy(logits_rows(np.random.default_rng(1), 1, V, "peaked"))
    calls = []
    real = keptset._full
    monkeypatch.setattr(
        keptset,
        "_full",
        lambda z, plan, inp, plain, spilled, **kw: (
            calls.append(sum(int(s.numel()) for s in spilled)) or real(z, plan, inp, plain, spilled, **kw)
        ),
    )
    p = SamplingParams(top_k=top_k, top_p=top_p, seed=3, logprobs_mode="processed")
    a = Sampler().sample(x, _batch([p]), torch.tensor([7]))
    assert sum(calls) == (1 if spills else 0)  # (no full strategy at all when none spills)
    b = Sampler(filter_impl="sort").sample(x, _batch([p]), torch.tensor([7]))
    assert torch.equal(a.token_ids, b.token_ids)
    assert torch.equal(a.logprobs.view(torch.int32), b.logprobs.view(torch.int32))


def _equal_to_sort(ps, x, positions=None):
    positions = torch.arange(len(ps)) + 7 if positions is None else positions
    a = Sampler().sample(x, _batch(ps, x.shape[1]), positions)
    b = Sampler(filter_impl="sort").sample(x, _batch(ps, x.shape[1]), positions)
    assert torch.equal(a.token_ids, b.token_ids)
    assert torch.equal(a.logprobs.view(torch.int32), b.logprobs.view(torch.int32))


NUCLEI = [
    SamplingParams(top_p=p, temperature=t, seed=s, logprobs_mode="processed")
    for s, (p, t) in enumerate([(0.9, 1.0), (0.5, 0.7), (0.99, 1.3), (0.3, 1.0)])
]


def test_nucleus_rows_cut_with_a_wide_mass_bracket_take_their_exact_mass(monkeypatch, by_value):
    """A top-p row's candidates are cut with both ends of the bracket of its full-row
    mass; where the two ends keep different sets, the row's exact mass decides. Widened
    to 20% of the mass, the bracket leaves most rows ambiguous, and every row still gets
    the sort's bits. Bug it would catch: a row cut with one end of the bracket only (its
    nucleus a few tokens too long or short). (Where the masses are one fused pass, a CPU
    with numba, rows take their exact mass at once: the bracket is the torch
    composition's route, forced here.)"""
    monkeypatch.setattr(keptset.rules, "fused_masses", lambda z: False)
    real = keptset.nucleus.mass_bounds
    calls = []

    def wide(z, frac, **kw):
        lo, hi = real(z, frac, **kw)
        calls.append(1)
        return lo - lo // 5, hi + hi // 5

    monkeypatch.setattr(keptset.nucleus, "mass_bounds", wide)
    x = torch.from_numpy(logits_rows(np.random.default_rng(3), len(NUCLEI), V, "random"))
    _equal_to_sort(NUCLEI, x)
    assert calls


@pytest.mark.parametrize("family", ["random", "peaked", "ties"])
def test_nucleus_rows_whose_bound_is_not_below_the_threshold_spill(monkeypatch, by_value, family):
    """The bounded strategy checks its own premise: the candidates' survivor mass must
    fail the top-p test (else a kept token could lie at or below L). A bound placed too
    high (here just below the row's maximum) fails the check, and the row spills to the
    full strategy and keeps the sort's bits. Bug it would catch: candidates trusted
    without the check (the nucleus cut to the few tokens above the bound)."""
    real = keptset.nucleus.lower_bound

    def too_high(maxima, thr, limit, frac):
        L, found = real(maxima, thr, limit, frac)
        return torch.full_like(L, -1e-30), torch.ones_like(found)

    monkeypatch.setattr(keptset.nucleus, "lower_bound", too_high)
    spilled = []
    full = keptset._full
    monkeypatch.setattr(
        keptset,
        "_full",
        lambda z, plan, inp, plain, sp, **kw: (
            spilled.append(sum(int(s.numel()) for s in sp)) or full(z, plan, inp, plain, sp, **kw)
        ),
    )
    x = torch.from_numpy(logits_rows(np.random.default_rng(4), len(NUCLEI), V, family))
    _equal_to_sort(NUCLEI, x)
    assert sum(spilled) >= 1


def test_flat_and_peaked_nuclei_in_one_batch(top_p_route):
    """Rows whose group maxima never reach the limit (flat: the nucleus spans most of
    the row) spill, their neighbours are decided on candidates, all with the sort's
    bits."""
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [
            logits_rows(rng, 2, V, "peaked"),
            np.zeros((1, V), np.float32),
            rng.standard_normal((2, V)).astype(np.float32) * 0.1,
        ]
    )
    ps = [SamplingParams(top_p=0.95, seed=i, logprobs_mode="processed") for i in range(5)]
    _equal_to_sort(ps, torch.from_numpy(x))


@pytest.mark.parametrize(
    "rows,vocab,large",
    [
        (1, 32000, False),
        (8, 32000, False),
        (64, 32000, False),
        (8, 152064, False),
        (16, 152064, True),
        (1, 152064, False),
    ],
)
@pytest.mark.parametrize("family", ["peaked", "gaussian"])
def test_top_p_rows_take_candidates_by_value_from_a_size_on(monkeypatch, rows, vocab, large, family):
    """Top-p rows of at least ``BY_VALUE_MIN`` elements take their candidates by value
    at once (spied: nucleus.above, no topk); smaller ones a topk of
    ``NUCLEUS_CANDIDATES`` first, where a peaked row's nucleus ends (no by-value pass)
    and a flat top's (sigma 3) does not (then by value). All keep the sort's bits. Bug
    it would catch: a small decode batch paying the by-value passes (about twice a topk
    at B=1, V=32000), a large batch paying a topk of every row, or a flat top growing a
    topk to thousands of candidates."""
    calls = {"above": 0, "topk": 0}
    real_above, real_grown = keptset.nucleus.above, keptset._grown

    def spy(name, fn):
        return lambda *a, **k: calls.__setitem__(name, calls[name] + 1) or fn(*a, **k)

    monkeypatch.setattr(keptset.nucleus, "above", spy("above", real_above))
    monkeypatch.setattr(keptset, "_grown", spy("topk", real_grown))
    x = make_logits(Case(rows, vocab, "topp0.9_T0.8", family))
    ps = [
        SamplingParams(top_p=0.9, temperature=0.8, seed=i, logprobs_mode="processed") for i in range(rows)
    ]  # the benchmark's top-p config: peaked nuclei of 1-6 tokens
    _equal_to_sort(ps, x)
    assert calls["topk"] == (0 if large else 1)
    assert calls["above"] == (1 if large or family == "gaussian" else 0)
