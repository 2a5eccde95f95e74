"""detsample/ops/hostcut.py: the bounded top-k route on host arrays equals its torch
operations (``topk_candidates``, ``candidate_cut``, ``kept_cdf``, ``draw_by_cdf``) bit
for bit."""

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample import rules
from detsample.ops import draw as D
from detsample.ops import filters as F
from detsample.ops import hostcut as H
from detsample.rng import row_uniforms
from tests.helpers import logits_rows

FAMILIES = ["peaked", "ties", "neginf", "bf16", "flat", "huge", "boundary"]
K = 24


def _scaled_candidates(rng, family, rows, V, k_max):
    """(rows, k_max + 1) descending scaled candidates and ids, as the Sampler takes
    them: a topk of logits, then (x - max) / T."""
    if family == "huge":  # x - max overflows to -inf for part of the row
        x = rng.uniform(-3.4e38, 3.4e38, (rows, V)).astype(np.float32)
    elif family in ("flat", "boundary"):
        x = np.zeros((rows, V), np.float32)
        if family == "boundary":  # a tie group straddling the candidate bound
            x[:, k_max + 4:] = -1.0
            x[:, 0] = 2.0
    else:
        x = logits_rows(rng, rows, V, family)
        if family == "neginf":  # fewer finite values than candidates: -inf candidates
            x[:, 5:] = -np.inf
    xt = torch.from_numpy(x)
    temps = torch.from_numpy(rng.choice([0.5, 0.8, 1.3], rows).astype(np.float32))[:, None]
    return F.logit_topk(xt, xt.amax(1, keepdim=True), temps, k_max)


def _filters(rng, rows, k_max, use_p, use_m):
    kk = torch.from_numpy(rng.integers(2, k_max + 1, rows))
    pp = torch.from_numpy(rng.choice([1.0, 0.95, 0.5, 0.1], rows))
    mm = torch.from_numpy(rng.choice([0.0, 0.05, 0.4], rows).astype(np.float32))
    k_index = (kk.clamp(1, k_max) - 1)[:, None]
    tp = torch.where(pp >= 1, torch.tensor(float("inf"), dtype=torch.float64), pp)[:, None]
    return kk, pp, mm, k_index, tp if use_p else None, mm[:, None] if use_m else None


@given(st.integers(0, 2**32 - 1), st.sampled_from(FAMILIES), st.booleans(), st.booleans(),
       st.booleans(), st.sampled_from([1, 3, 8]))
def test_host_tables_equal_the_torch_route(seed, family, use_p, use_m, cut_k, rows):
    """Same fits, kept prefix, threshold, kept mass, CDF table and drawn token as the
    torch operations, whatever the filters of each row (per-row top-k, top-p with
    disabled rows, min-p), ties, -inf candidates, huge magnitudes, spills included."""
    rng = np.random.default_rng(seed)
    V = 300
    vals, ids = _scaled_candidates(rng, family, rows, V, K)
    kk, pp, mm, k_index, tp, mp = _filters(rng, rows, K, use_p, use_m)
    if not cut_k:  # every row's top-k is the candidate count
        kk = torch.full((rows,), K)
        k_index = torch.full((rows, 1), K - 1)
    frac = rules.frac_bits(V)
    u = row_uniforms(torch.arange(rows) + seed % 997, torch.arange(rows) + 3)
    t = H.candidate_tables(vals, ids, k_index, cut_k, tp, mp, frac=frac, k_max=K, u=u.numpy())
    cv, ci, fits = F.cut_candidates(vals, ids, k_index, K, V)
    n, kept, q = F.candidate_cut(cv, k_index, cut_k, tp, mp, frac)
    sorted_ids, csum = D.kept_cdf(ci, q, kept)
    assert np.array_equal(t.fits, fits.numpy()) and np.array_equal(t.n, n.numpy())
    assert np.array_equal(t.tau.view(np.int32),
                          cv.gather(1, (n - 1)[:, None]).squeeze(1).numpy().view(np.int32))
    assert np.array_equal(t.csum, csum.numpy()) and np.array_equal(t.total, csum[:, -1].numpy())
    assert np.array_equal(t.sorted_ids, sorted_ids.numpy())
    assert np.array_equal(t.tokens, D.draw_by_cdf_torch(sorted_ids, csum, u).numpy())
    ref = F.kept_prefix_length(cv, kk, pp if use_p else None, mm if use_m else None, frac)
    assert np.array_equal(t.n, ref.numpy())  # the specification's kept prefix


@given(st.integers(0, 2**32 - 1), st.sampled_from(FAMILIES), st.booleans(), st.booleans(),
       st.booleans(), st.sampled_from([1, 2, 5]))
def test_one_row_scalars_equal_the_host_tables(seed, family, use_p, use_m, cut_k, rows):
    """``draw_one_row`` (Python scalars, the kept sets found as prefixes) gives each row
    the ``fits`` and token of ``candidate_tables``, whatever the filters, ties, ``-inf``
    candidates, huge magnitudes and spills. Bug it would catch: a prefix walk that stops
    inside a tie group, or a top-p count that differs from the array form's when the
    limit is ``inf`` (top-p disabled) or NaN."""
    rng = np.random.default_rng(seed)
    V = 300
    vals, ids = _scaled_candidates(rng, family, rows, V, K)
    kk, pp, mm, k_index, tp, mp = _filters(rng, rows, K, use_p, use_m)
    if not cut_k:
        k_index = torch.full((rows, 1), K - 1)
    frac = rules.frac_bits(V)
    u = row_uniforms(torch.arange(rows) + seed % 997, torch.arange(rows) + 3).numpy()
    t = H.candidate_tables(vals, ids, k_index, cut_k, tp, mp, frac=frac, k_max=K, u=u)
    e = torch.exp(vals).tolist()
    for r in range(rows):
        fits, token = H.draw_one_row(
            vals[r].tolist(), e[r], ids[r].tolist(),
            (int(k_index[r, 0]), cut_k, None if tp is None else float(tp[r, 0]),
             None if mp is None else float(mp[r, 0])), frac=frac, k_max=K, u=float(u[r]))
        assert fits == bool(t.fits[r]) and token == int(t.tokens[r]), (family, r)


def test_one_row_scalars_at_the_table_edges():
    """Uniforms at the ends of (0, 1), a row whose whole mass is on one candidate, a row
    whose candidates are all ``-inf`` but the first, and a row without any mass (never
    from the sampler, whose top candidate has mass ``2**frac``): the scalar draw lands
    where the array draw does."""
    K1 = 6
    vals = torch.tensor([[0.0, -1.0, -1.0, -200.0, -np.inf, -np.inf, -np.inf],
                         [0.0] + [-np.inf] * K1,
                         [-200.0] * K1 + [-300.0]], dtype=torch.float32)
    ids = torch.tensor([[9, 4, 7, 1, 2, 3, 5], [6, 0, 1, 2, 3, 4, 5], [3, 1, 4, 0, 5, 9, 2]])
    k_index = (4, 2, 1)
    for uu in (2.0**-53, 0.5, 1 - 2.0**-53):
        u = np.array([uu] * 3)
        for tp in (None, torch.tensor([[0.5], [np.inf], [np.inf]], dtype=torch.float64)):
            with np.errstate(invalid="ignore"):  # the massless row's inf * 0 (never from
                # the sampler: its top candidate, z = 0, has mass 2**frac)
                t = H.candidate_tables(vals, ids, torch.tensor(k_index)[:, None], True, tp,
                                       None, frac=20, k_max=K1, u=u)
            e = torch.exp(vals).tolist()
            for r in range(3):
                got = H.draw_one_row(vals[r].tolist(), e[r], ids[r].tolist(),
                                     (k_index[r], True, None if tp is None else float(tp[r, 0]),
                                      None), frac=20, k_max=K1, u=uu)
                assert got == (bool(t.fits[r]), int(t.tokens[r])), (uu, r)


def test_host_draw_equals_torch_draw_at_the_table_edges():
    """Uniforms at the ends of (0, 1) and a table whose mass sits on one token: the
    target is clamped to ``Q - 1`` and the search lands on a kept id, as in torch."""
    sorted_ids = torch.tensor([[3, 9, rules.PAD_ID], [7, rules.PAD_ID, rules.PAD_ID]])
    csum = torch.tensor([[5, 2**40, 2**40], [2**52, 2**52, 2**52]])
    for uu in (2.0**-53, 0.5, 1 - 2.0**-53):
        u = torch.tensor([uu, uu], dtype=torch.float64)
        want = D.draw_by_cdf_torch(sorted_ids, csum, u)
        assert torch.equal(D.draw_by_cdf(sorted_ids, csum, u), want)
        assert torch.equal(torch.from_numpy(H.draw_by_cdf(sorted_ids.numpy(), csum.numpy(),
                                                          u.numpy())), want)


@given(st.integers(0, 2**32 - 1), st.sampled_from(["spread", "sparse", "one", "tail"]),
       st.integers(1, 5))
def test_host_block_draw_equals_torch_block_draw(seed, family, rows):
    """The host block draw (a row at a time) lands on the token of the torch block draw
    (padded last block, searchsorted), for masses spread over the row, mostly zero, on
    one token, or in the short last block, and for uniforms at the ends of (0, 1). Bug
    it would catch: a count inside the block that reads past the row's last token, or a
    block base taken from the wrong running sum."""
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
        q[:, :3 * D.BLOCK] = 0
        q[:, -1] = 7
    qt = torch.from_numpy(q)
    nb = V // D.BLOCK
    sums = torch.cat([qt[:, :nb * D.BLOCK].view(rows, nb, D.BLOCK).sum(-1),
                      qt[:, nb * D.BLOCK:].sum(-1, keepdim=True)], dim=1)
    bsum = sums.cumsum(-1)
    for u in (torch.from_numpy(rng.random(rows)), torch.full((rows,), 2.0**-53),
              torch.full((rows,), 1 - 2.0**-53)):
        want = D.draw_by_blocks_torch(qt, bsum, u)
        got = H.draw_by_blocks(q, bsum.numpy(), u.numpy(), D.BLOCK)
        assert np.array_equal(got, want.numpy()), (family, u)
        assert torch.equal(D.draw_by_blocks(qt, bsum, u), want)
