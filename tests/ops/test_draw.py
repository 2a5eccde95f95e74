"""The seeded draw: compact == full path bitwise; chi-square goodness of fit."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import chisquare

from detsample import Request, Sampler, SamplingBatch, SamplingParams, arith, rules
from detsample.ops import draw as D
from detsample.ops import filters as F
from detsample.rng import row_uniforms
from tests.helpers import compact_cdf, logits_rows, topk_candidates

ALPHA = 1e-3  # chi-square significance level (fixed seeds: the outcome is reproducible)


@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 4, 25]), st.sampled_from([1.0, 0.6]))
def test_compact_and_full_draw_agree(seed, k, p):
    """Exact integer masses make the compact (kept ids) and the blocked full-vocabulary
    path pick the same token and the same total mass."""
    rng = np.random.default_rng(seed)
    V = 2500  # not a multiple of BLOCK: exercises the short last block
    z = rng.standard_normal((5, V)) * 3
    z = torch.from_numpy((z - z.max(1, keepdims=True)).astype(np.float32))
    frac = rules.frac_bits(V)
    kk, pp, mm = torch.full((5,), k), torch.full((5,), p, dtype=torch.float64), rules.element_tensor(5)
    vals, ids, fits = topk_candidates(z, kk, 40)
    n = F.kept_prefix_length(vals, kk, pp, mm, frac)
    u = row_uniforms(torch.arange(5) + seed, torch.arange(5))
    sorted_ids, csum = compact_cdf(vals, ids, n, frac)
    t1, q1 = D.draw_by_cdf(sorted_ids, csum, u), csum[:, -1]
    tau = vals.gather(1, (n - 1)[:, None]).squeeze(1)
    q, bsum = D.block_cdf(z, tau, mm, frac)
    t2, q2 = D.draw_by_blocks(q, bsum, u), bsum[:, -1]
    assert torch.equal(t1[fits], t2[fits]) and torch.equal(q1[fits], q2[fits])


def _expected_probs(logits, T, k, p):
    z = (logits - logits.max()) / T
    order = np.argsort(-z, kind="stable")
    pr = np.exp(z) / np.exp(z).sum()
    keep = np.zeros_like(pr, dtype=bool)
    keep[order[:k]] = True
    pk = np.where(keep, pr, 0) / pr[keep].sum()
    above = np.array([pk[(z > z[i]) & keep].sum() for i in range(len(z))])
    keep &= above < p
    out = np.where(keep, pr, 0)
    return out / out.sum()


DIST_CASES = [("over seeds", "seeds"), ("over positions", "positions")]


@pytest.mark.parametrize("name,vary", DIST_CASES)
def test_draws_follow_filtered_distribution(name, vary):
    """Chi-square goodness of fit at alpha=1e-3 against the filtered distribution."""
    logits = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], dtype=np.float32)
    V, N, T, k, p = len(logits), 6000, 0.9, 6, 0.95
    req = Request("d", SamplingParams(temperature=T, top_k=k, top_p=p, seed=99))
    reqs = (
        [Request(f"d{i}", SamplingParams(temperature=T, top_k=k, top_p=p, seed=1000 + i)) for i in range(N)]
        if vary == "seeds"
        else [req] * N
    )
    batch = SamplingBatch.from_requests(reqs, V)
    pos = torch.zeros(N, dtype=torch.int64) if vary == "seeds" else torch.arange(N)
    x = torch.from_numpy(np.tile(logits, (N, 1)))
    toks = Sampler().sample(x, batch, pos).token_ids.numpy()
    expected = _expected_probs(logits.astype(np.float64), T, k, p)
    counts = np.bincount(toks, minlength=V)
    support = expected > 0
    assert counts[~support].sum() == 0, "a filtered-out token was drawn"
    stat = chisquare(counts[support], expected[support] * N)
    assert stat.pvalue > ALPHA, (name, counts, expected * N)


def test_every_request_has_its_own_stream():
    """Two requests with different seeds at the same position draw independently: their
    joint outcomes are not identical."""
    N = 400
    reqs = [Request(f"s{i}", SamplingParams(seed=i)) for i in range(N)]
    x = torch.zeros(N, 16)
    toks = Sampler().sample(x, SamplingBatch.from_requests(reqs, 16), torch.zeros(N, dtype=torch.int64)).token_ids
    assert len(set(toks.tolist())) == 16
    stat = chisquare(np.bincount(toks.numpy(), minlength=16))
    assert stat.pvalue > ALPHA


def test_exp_floor_changes_no_mass():
    """kept_mass clamps z at EXP_FLOOR before exp (a subnormal exp is ~24x slower on
    x86); every value below the floor must still get mass 0, as without the clamp."""
    z = torch.tensor([[0.0, -1.0, -40.0, -86.9, -87.0, -87.5, -100.0, -1e30, float("-inf")]])
    frac = rules.frac_bits(152064)
    q = D.kept_mass(z, torch.tensor([float("-inf")]), rules.element_tensor(1), frac)
    ref = (arith.exp(z) * 2.0**frac).to(torch.int64)
    assert torch.equal(q, ref)
    assert math.exp(rules.EXP_FLOOR) * 2.0**52 < 1.0


def _argmax_rows(rng, B, V, family):
    """Rows that stress the two-level argmax: maxima tied across blocks, NaN before or
    after the maximum, +inf, a fully masked row, huge magnitudes, signed zeros."""
    x = rng.standard_normal((B, V)).astype(np.float32)
    if family == "coarse":  # a handful of values: the maximum is tied in many blocks
        x = np.round(x).astype(np.float32)
    elif family == "nan":
        x[:, rng.integers(0, V)] = np.nan
        x[0, V - 1] = np.nan
    elif family == "posinf":
        x[:, rng.integers(0, V)] = np.inf
        x[:, V - 2] = np.inf
    elif family == "neginf":
        x[:] = -np.inf
        x[1:, rng.integers(0, V, 3)] = 2.0
    elif family == "huge":  # finite, near the float32 limits
        x = rng.uniform(-3.4e38, 3.4e38, (B, V)).astype(np.float32)
    elif family == "zeros":  # maxima are +0.0 and -0.0, equal in value
        x = -np.abs(x)
        x[:, rng.integers(0, V, 4)] = -0.0
        x[:, rng.integers(0, V, 4)] = 0.0
    return torch.from_numpy(x)


ARGMAX_FAMILIES = ["random", "coarse", "nan", "posinf", "neginf", "huge", "zeros"]


@pytest.mark.parametrize("family", ARGMAX_FAMILIES)
@pytest.mark.parametrize("B", [1, 3])
def test_greedy_argmax_equals_torch_argmax(family, B):
    """Bug it would catch: a CPU argmax that returns a later copy of a tied maximum,
    skips a NaN (torch.argmax returns the first NaN), or differs on +inf, a row that is
    -inf everywhere, signed zeros or a strided (non-contiguous) input."""
    rng = np.random.default_rng(7)
    for V in (16384, 32000):
        x = _argmax_rows(rng, B, V, family)
        assert torch.equal(D.greedy_argmax(x), torch.argmax(x, dim=-1)), (family, V)
        xt = x.t().contiguous().t()  # the same values, column-major
        assert torch.equal(D.greedy_argmax(xt), torch.argmax(x, dim=-1)), (family, V)


@given(
    st.integers(0, 2**32 - 1), st.integers(1, 5), st.sampled_from(ARGMAX_FAMILIES), st.sampled_from([7, 1000, 16000])
)
def test_greedy_argmax_property(seed, B, family, V):
    """Any rows, any vocabulary: the tokens of ``torch.argmax``."""
    x = _argmax_rows(np.random.default_rng(seed), B, V, family)
    assert torch.equal(D.greedy_argmax(x), torch.argmax(x, dim=-1))


@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(["random", "ties", "neginf"]),
    st.sampled_from([1.0, 0.5, 0.9]),
    st.sampled_from([0.0, 0.1]),
)
def test_id_order_cdf_equals_compact_cdf(seed, family, p, mp):
    """The table built from ``kept_prefix``'s kept mask and masses is the table of
    ``compact_cdf``, bit for bit, and draws the same tokens."""
    rng = np.random.default_rng(seed)
    V, rows, K = 600, 5, 40
    z = rng.standard_normal((rows, V)).astype(np.float32) * 3
    if family == "ties":
        z = np.round(z).astype(np.float32)
    elif family == "neginf":
        z[:, 3:] = -np.inf
    z = torch.from_numpy(z)
    z = z - z.amax(1, keepdim=True)
    frac = rules.frac_bits(V)
    kk = torch.tensor([2, 5, 40, 17, 40])
    vals, ids, fits = topk_candidates(z, kk, K)
    pp = torch.full((rows, 1), p if p < 1 else float("inf"), dtype=torch.float64)
    mm = rules.element_tensor(rows, min_p=mp)
    n, kept, q, _ = F.kept_prefix(vals, F.CandidateCut(k_index=(kk - 1)[:, None], top_p=pp, element=mm), frac)
    s1, c1 = compact_cdf(vals, ids, n, frac)
    s2, c2 = D.id_order_cdf(ids, q, kept)
    assert torch.equal(c1, c2) and torch.equal(s1.gather(1, (n - 1)[:, None]), s2.gather(1, (n - 1)[:, None]))
    u = row_uniforms(torch.arange(rows) + seed % 1000, torch.arange(rows))
    assert torch.equal(D.draw_by_cdf(s1, c1, u), D.draw_by_cdf(s2, c2, u))


@pytest.mark.parametrize("V", [D.BLOCK - 3, 3 * D.BLOCK, 3 * D.BLOCK + 100])
def test_block_sums_of_a_row_alone_equal_the_batched_sums(V):
    """A row's masses and running block sums are the same alone and in a batch, short last
    block included. Bug it would catch: a sum that drops or doubles the tail."""
    rng = np.random.default_rng(V)
    z = torch.from_numpy(logits_rows(rng, 6, V, "peaked"))
    z = z - z.amax(-1, keepdim=True)
    tau = torch.full((6,), float("-inf"))
    min_p = rules.element_tensor(6)
    q6, b6 = D.block_cdf(z, tau, min_p, 20)
    assert b6.shape == (6, -(-V // D.BLOCK))
    for r in range(6):
        q1, b1 = D.block_cdf(z[r : r + 1], tau[r : r + 1], min_p[r : r + 1], 20)
        assert torch.equal(q1, q6[r : r + 1]) and torch.equal(b1, b6[r : r + 1]), r
    assert torch.equal(b6[:, -1], q6.sum(-1))


def test_draw_by_cdf_at_the_table_edges():
    """Uniforms at the ends of (0, 1) and a table whose mass sits on one token: the
    target is clamped to ``Q - 1`` and the search lands on a kept id, never the padding."""
    sorted_ids = torch.tensor([[3, 9, rules.PAD_ID], [7, rules.PAD_ID, rules.PAD_ID]])
    csum = torch.tensor([[5, 2**40, 2**40], [2**52, 2**52, 2**52]])
    for uu, want in ((2.0**-53, [3, 7]), (0.5, [9, 7]), (1 - 2.0**-53, [9, 7])):
        u = torch.tensor([uu, uu], dtype=torch.float64)
        assert D.draw_by_cdf(sorted_ids, csum, u).tolist() == want, uu


@given(st.integers(0, 2**32 - 1), st.sampled_from(["spread", "sparse", "one", "tail"]), st.integers(1, 5))
def test_block_draw_equals_a_flat_search(seed, family, rows):
    """The two-level block draw lands on the token of one search over the whole row's
    running mass, for masses spread over the row, mostly zero, on one token, or in the
    short last block, and for uniforms at the ends of (0, 1). Bug it would catch: a count
    inside the block that reads past the row's last token, or a block base taken from the
    wrong running sum."""
    rng = np.random.default_rng(seed)
    V = 3 * D.BLOCK + 100  # a short last block
    q = rng.integers(0, 2**40, (rows, V))
    if family == "sparse":
        q[rng.random((rows, V)) < 0.995] = 0
        q[:, rng.integers(0, V)] = 1
    elif family == "one":
        q[:] = 0
        q[np.arange(rows), rng.integers(0, V, rows)] = 2**52
    elif family == "tail":
        q[:, : 3 * D.BLOCK] = 0
        q[:, -1] = 7
    qt = torch.from_numpy(q)
    nb = V // D.BLOCK
    sums = torch.cat(
        [qt[:, : nb * D.BLOCK].view(rows, nb, D.BLOCK).sum(-1), qt[:, nb * D.BLOCK :].sum(-1, keepdim=True)], dim=1
    )
    bsum = sums.cumsum(-1)
    flat = qt.cumsum(-1)
    for u in (torch.from_numpy(rng.random(rows)), torch.full((rows,), 2.0**-53), torch.full((rows,), 1 - 2.0**-53)):
        t = rules.draw_target(u, flat[:, -1]).unsqueeze(1)
        want = torch.searchsorted(flat, t, right=True).squeeze(1)
        assert torch.equal(D.draw_by_blocks(qt, bsum, u), want), (family, u)


@pytest.mark.parametrize("layout", ["shared", "mixed", "neutral rows", "boundary"])
def test_kept_mass_select_pass_equals_the_element_rule(layout):
    """kept_mass drops min-p's tokens by one select (``threshold`` just below min_p)
    instead of a mask; the masses must be those of the rule ``e >= min_p`` bit for bit,
    at the boundary too (a token whose ``exp`` equals min_p exactly is kept). Bug it
    would catch: a threshold at min_p itself (``threshold`` keeps ``e > t``), which
    drops the boundary token."""
    rng = np.random.default_rng(11)
    B, V = 6, 500
    z = torch.from_numpy((rng.standard_normal((B, V)) * 3).astype(np.float32))
    z = z - z.amax(1, keepdim=True)
    e = rules.floored_exp(z)
    mp = {
        "shared": [0.05] * B,
        "mixed": [0.05, 0.2, 0.0, 0.5, 1.0, 0.01],
        "neutral rows": [0.0, 0.0, 0.1, 0.0, 0.0, 0.0],
        "boundary": [float(e[r, r * 7]) for r in range(B)],
    }[layout]
    element = rules.element_tensor(B, min_p=torch.tensor(mp, dtype=torch.float32))
    frac = rules.frac_bits(V)
    q = D.kept_mass(z.clone(), torch.full((B,), float("-inf")), element, frac)
    want = rules.mass(e, frac) * rules.element_keeps(e, element)
    assert torch.equal(q, want)
    if layout == "boundary":
        assert all(int(q[r, r * 7]) > 0 or int(want[r, r * 7]) == 0 for r in range(B))
        assert bool(rules.element_keeps(e, element)[torch.arange(B), torch.arange(B) * 7].all())
