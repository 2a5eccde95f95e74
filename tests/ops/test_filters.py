"""Filters: value semantics, bounded topk == full sort, agreement with the oracle."""

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample import arith, rules
from detsample.ops import filters as F
from detsample.ops.temperature import scale_logits
from oracles import sampler as osamp
from tests.helpers import topk_candidates

CASES = [
    # (values, top_k, top_p, min_p, expected kept prefix length)
    ([3.0, 2.0, 2.0, 1.0], 2, 1.0, 0.0, 3),  # tie at the top-k boundary is kept
    ([3.0, 2.0, 2.0, 1.0], 1, 1.0, 0.0, 1),
    ([0.0, 0.0, 0.0, 0.0], 2, 1.0, 0.0, 4),  # all tied: all kept
    ([0.0, 0.0, -1.0], 3, 0.4, 0.0, 2),  # top-p keeps the whole tie group
    ([0.0, -10.0, -20.0], 3, 1.0, 0.5, 1),  # min-p on exp(z)
    ([0.0, -np.inf, -np.inf], 3, 0.9, 0.0, 1),
]


def test_kept_prefix_cases():
    for vals, k, p, mp, want in CASES:
        z = torch.tensor([vals], dtype=torch.float32)
        n = F.kept_prefix_length(
            z,
            torch.tensor([k]),
            torch.tensor([p], dtype=torch.float64),
            rules.element_tensor(1, min_p=mp),
            rules.frac_bits(len(vals)),
        )
        assert int(n) == want, (vals, k, p, mp)


@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([1, 2, 5, 17]),
    st.sampled_from([0.2, 0.7, 1.0]),
    st.sampled_from([0.0, 0.1]),
    st.sampled_from(["ties", "random", "coarse"]),
)
def test_topk_candidates_equal_full_sort(seed, k, p, mp, family):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((6, 300))
    if family == "ties":
        z = np.round(z)
    elif family == "coarse":
        z = np.round(z * 4) / 4
    z = torch.from_numpy((z - z.max(1, keepdims=True)).astype(np.float32))
    frac = rules.frac_bits(300)
    kk = torch.full((6,), k)
    pp = torch.full((6,), p, dtype=torch.float64)
    mm = rules.element_tensor(6, min_p=mp)
    tau_sort = F.thresholds_by_sort(z, kk, pp, mm, frac)
    vals, ids, fits = topk_candidates(z, kk, max(k, 40))
    n = F.kept_prefix_length(vals, kk, pp, mm, frac)
    tau_topk = vals.gather(1, (n - 1)[:, None]).squeeze(1)
    assert torch.equal(tau_sort[fits], tau_topk[fits])
    for r in range(6):  # the kept ids are identical sets
        if fits[r]:
            assert set(ids[r, : int(n[r])].tolist()) == set((z[r] >= tau_sort[r]).nonzero().flatten().tolist())


@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([-1, 3, 30]),
    st.sampled_from([1.0, 0.5, 0.9]),
    st.sampled_from([0.0, 0.2]),
)
def test_kept_set_matches_oracle(seed, k, p, mp):
    """Integer outcomes (the kept set) equal the float64 oracle away from near-ties."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(200) * 2).astype(np.float32)
    T = 0.9
    z = torch.from_numpy(x)[None]
    z = (z - z.max()) / torch.tensor(T, dtype=torch.float32)
    tau = F.thresholds_by_sort(
        z,
        torch.tensor([200 if k == -1 else k]),
        torch.tensor([p], dtype=torch.float64),
        rules.element_tensor(1, min_p=mp),
        rules.frac_bits(200),
    )
    kept = (z[0] >= tau).logical_and(arith.exp(z[0]) >= torch.tensor(mp, dtype=torch.float32))
    r = osamp.sample_row(x, osamp.RowParams(temperature=T, top_k=k, top_p=p, min_p=mp, seed=1), 0)
    if r.margin > 1e-5:
        assert kept.nonzero().flatten().tolist() == r.kept


def test_frac_bits_keeps_sums_in_int64():
    for V in [2, 512, 32000, 152064, 256000, 1 << 20]:
        f = rules.frac_bits(V)
        assert V * 2**f <= 2**62 and f <= 52  # sums of q stay below 2**63


NUCLEUS_FAMILIES = ["peaked", "flat", "ties", "neginf", "bf16"]


def _family(rng, rows, V, family):
    z = rng.standard_normal((rows, V)).astype(np.float32) * 3
    if family == "peaked":
        for r in range(rows):
            z[r, rng.choice(V, 10, replace=False)] += np.linspace(14, 4, 10).astype(np.float32)
    elif family == "ties":
        z = np.round(z).astype(np.float32)
    elif family == "neginf":
        z[rng.random((rows, V)) < 0.7] = -np.inf
        z[:, 0] = 1.0
    elif family == "bf16":
        z = torch.from_numpy(z).to(torch.bfloat16).float().numpy()
    z = torch.from_numpy(z)
    return z - z.amax(1, keepdim=True)


@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(NUCLEUS_FAMILIES),
    st.sampled_from([-1, 700, 1500]),
    st.sampled_from([0.3, 0.9, 0.99]),
    st.sampled_from([0.0, 0.05]),
    st.sampled_from([8, 64, 2000]),
)
def test_nucleus_on_candidates_equals_full_sort(seed, family, k, p, mp, K):
    """Top-p (with or without a large top-k, with min-p) decided on a bounded ``topk``
    against the exact survivor mass gives the full sort's kept prefix and threshold,
    ties included, for every row it calls decided; K = V decides every row."""
    rng = np.random.default_rng(seed)
    V, rows = 2000, 6
    z = _family(rng, rows, V, family)
    frac = rules.frac_bits(V)
    kk = torch.full((rows,), V if k == -1 else k)
    pp, mm = torch.full((rows,), p, dtype=torch.float64), rules.element_tensor(rows, min_p=mp)
    tau_sort = F.thresholds_by_sort(z, kk, pp, mm, frac)
    sz, _ = torch.sort(z, dim=-1, descending=True, stable=True)
    thr = F.topk_threshold(z, kk)
    assert torch.equal(
        thr, torch.where(kk < V, sz.gather(1, (kk - 1)[:, None]).squeeze(1), torch.tensor(float("-inf")))
    )
    mass = F.survivor_mass(z, thr, frac)
    want_mass = (rules.mass(arith.exp(sz), frac) * (sz >= thr[:, None])).sum(-1)
    assert torch.equal(mass, want_mass)
    vals, ids = torch.topk(z, K, dim=-1)
    n, _, _, _ = F.kept_prefix(
        vals, F.CandidateCut(thr=thr[:, None], total=mass[:, None], top_p=pp[:, None], element=mm), frac
    )
    decided = n < K
    if K == V:
        assert bool(decided[n < K].all())
        decided = torch.ones_like(decided)
    tau = vals.gather(1, (n - 1)[:, None]).squeeze(1)
    assert torch.equal(tau[decided], tau_sort[decided])
    for r in decided.nonzero().flatten().tolist():  # every kept token is a candidate
        kept = set((z[r] >= tau_sort[r]).nonzero().flatten().tolist())
        assert set(ids[r, : int(n[r])].tolist()) == kept
    if family == "peaked" and p <= 0.9 and K >= 64:
        assert bool(decided.all())  # a peaked nucleus fits in 64 candidates


CUT_FAMILIES = ["peaked", "ties", "neginf", "bf16", "flat"]


def _cut_inputs(rng, family, rows=6, V=800):
    z = _family(rng, rows, V, family) if family != "flat" else torch.zeros(rows, V)
    return z, torch.from_numpy(rng.integers(2, 41, rows)), V


@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(CUT_FAMILIES),
    st.lists(st.sampled_from([1.0, 0.95, 0.6, 0.2]), min_size=6, max_size=6),
    st.lists(st.sampled_from([0.0, 0.0, 0.3]), min_size=6, max_size=6),
)
def test_kept_prefix_on_candidates_equals_kept_prefix_length(seed, family, ps, mps):
    """``kept_prefix`` (top-p from the exclusive running sum, no tie-group pass) keeps
    the prefix ``kept_prefix_length`` keeps, bit for bit, with per-row top-k, top-p and
    min-p mixed in one batch (a row without top-p next to rows with it, whose top-k
    still cuts). Bug it would catch: a disabled top-p (``+inf``) undoing the top-k."""
    rng = np.random.default_rng(seed)
    z, kk, V = _cut_inputs(rng, family)
    frac = rules.frac_bits(V)
    K = 40
    pp = torch.tensor(ps, dtype=torch.float64)
    mm = rules.element_tensor(len(mps), min_p=torch.tensor(mps, dtype=torch.float32))
    vals, ids, fits = topk_candidates(z, kk, K)
    want = F.kept_prefix_length(vals, kk, pp, mm, frac)
    tp = torch.where(pp >= 1, torch.tensor(float("inf"), dtype=torch.float64), pp)[:, None]
    for use_p, use_m in ((True, True), (True, False), (False, True), (False, False)):
        ref = F.kept_prefix_length(vals, kk, pp if use_p else None, mm if use_m else None, frac)
        n, kept, q, _ = F.kept_prefix(
            vals,
            F.CandidateCut(k_index=(kk - 1)[:, None], top_p=tp if use_p else None, element=mm if use_m else None),
            frac,
        )
        assert torch.equal(n, ref), (use_p, use_m)
        assert torch.equal(kept, torch.arange(K + 1)[None, :] < n[:, None])
        assert torch.equal(q, rules.mass(arith.exp(vals), frac))
    tau = vals.gather(1, (want - 1)[:, None]).squeeze(1)
    tau_sort = F.thresholds_by_sort(z, kk, pp, mm, frac)
    assert torch.equal(tau[fits], tau_sort[fits])


@given(st.integers(0, 2**32 - 1), st.sampled_from(CUT_FAMILIES), st.lists(st.booleans(), min_size=6, max_size=6))
def test_kept_prefix_of_small_top_k_rows_beside_top_p_rows(seed, family, small):
    """One call cuts a group mixing rows whose top-k survivors are all candidates (their
    mass summed there) and top-p rows with a large or no top-k (their threshold and mass
    from the full row): each row keeps the full sort's prefix whenever the sampler would
    call it decided. Bug it would catch: a top-p row's limit taken from the candidates'
    mass, or a small row's from a neighbour's full-row mass."""
    rng = np.random.default_rng(seed)
    z, kk, V = _cut_inputs(rng, family)
    frac, K = rules.frac_bits(V), 64
    sm = torch.tensor(small)
    kk = torch.where(sm, kk, torch.tensor(V))  # the other rows: no top-k
    pp = torch.full((6,), 0.8, dtype=torch.float64)
    mm = rules.element_tensor(6)
    thr = F.topk_threshold(z, kk)
    total = F.survivor_mass(z, thr, frac)
    vals, ids = torch.topk(z, K + 1, dim=-1)
    cut = F.CandidateCut(
        k_index=(kk.clamp(max=K) - 1)[:, None],
        small=sm[:, None],
        thr=thr[:, None],
        total=total[:, None],
        top_p=pp[:, None],
    )
    n, kept, _, t = F.kept_prefix(vals, cut, frac)
    fits = torch.where(sm, vals[:, -1] < t.squeeze(1), n < K + 1)
    tau = vals.gather(1, (n - 1)[:, None]).squeeze(1)
    tau_sort = F.thresholds_by_sort(z, kk, pp, mm, frac)
    assert torch.equal(tau[fits].view(torch.int32), tau_sort[fits].view(torch.int32))
    if family == "peaked":
        assert bool(fits.all())


@given(st.integers(0, 2**32 - 1), st.sampled_from(CUT_FAMILIES + ["huge"]), st.sampled_from([0.3, 0.8, 1.0, 1.7]))
def test_logit_topk_equals_topk_of_scaled_logits(seed, family, T):
    """The candidates taken from the logits and scaled afterwards carry the bits of the
    candidates of the scaled logits: the same values, the same id set in every prefix
    ending at a tie-group boundary (ids may be ordered differently inside a tie group)."""
    rng = np.random.default_rng(seed)
    rows, V = 5, 700
    if family == "huge":
        # finite, but x - max overflows to -inf for half the row (a -inf tie group)
        x = torch.from_numpy(rng.uniform(-3e38, 3e38, (rows, V)).astype(np.float32))
    else:
        x = _family(rng, rows, V, family) * 1.7 + 3.0
    m = x.amax(1, keepdim=True)
    temps = torch.full((rows, 1), T)
    z = scale_logits(x, m, temps)
    v1, i1 = torch.topk(z, 41, dim=-1)
    v2, i2 = F.logit_topk(x, m, temps, 41)
    assert torch.equal(v1.view(torch.int32), v2.view(torch.int32))
    for r in range(rows):
        ends = [j for j in range(1, 41) if v1[r, j] != v1[r, j - 1]] + [41]
        for e in ends[:-1]:  # every prefix ending at a tie-group boundary
            assert set(i1[r, :e].tolist()) == set(i2[r, :e].tolist())


def _boundary_row(V: int, frac: int):
    """A descending row of distinct values and a top_p with ``top_p * float64(Z) ==
    float64(q_0)`` exactly: the mass above the second value equals the limit."""
    rng = np.random.default_rng(3)
    for _ in range(1000):
        z = np.sort(-rng.random(V).astype(np.float32) * 8)[::-1].copy()
        z[0] = 0.0
        zt = torch.from_numpy(z)
        q = rules.mass(arith.exp(zt), frac)
        Z = int(q.sum())
        top_p = float(q[0]) / float(Z)
        if top_p * float(Z) == float(q[0]) and len(set(z.tolist())) == V:
            return zt, top_p
    raise AssertionError("no boundary row found")


def test_top_p_drops_a_value_whose_mass_above_equals_the_limit():
    """The top-p test is strict: a value whose mass strictly above is exactly ``top_p *
    Z`` is dropped, in every torch form of the kept-prefix search (the sorted row, the
    candidates, the radix select's bins). Bug it would catch: ``<=`` for ``<`` in the
    one search, keeping one token too many on an exact boundary."""
    from detsample.ops.radix import thresholds_by_select

    V = 64
    frac = rules.frac_bits(V)
    z, top_p = _boundary_row(V, frac)
    tp = torch.tensor([top_p], dtype=torch.float64)
    n = F.kept_prefix_length(z[None], torch.tensor([V]), tp, None, frac)
    assert n.tolist() == [1]
    n, _, _, _ = F.kept_prefix(z[None], F.CandidateCut(top_p=tp[:, None]), frac)
    assert n.tolist() == [1]
    tau = thresholds_by_select(z[None], torch.tensor([V]), tp, rules.element_tensor(1), frac)
    assert tau.tolist() == [0.0]
