"""detsample/ops/hostcut.py: the bounded top-k route on host arrays equals its torch
operations (``cut_candidates``, ``candidate_cut``, ``kept_cdf``) bit for bit."""

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample import rules
from detsample.ops import draw as D
from detsample.ops import filters as F
from detsample.ops import hostcut as H
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
    """Same fits, kept prefix, threshold, kept mass and CDF table as the
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
    t = H.candidate_tables(vals, ids, k_index, cut_k, tp, mp, frac=frac, k_max=K)
    cv, ci, fits = F.cut_candidates(vals, ids, k_index, K, V)
    n, kept, q = F.candidate_cut(cv, k_index, cut_k, tp, mp, frac)
    sorted_ids, csum = D.kept_cdf(ci, q, kept)
    assert np.array_equal(t.fits, fits.numpy()) and np.array_equal(t.n, n.numpy())
    assert np.array_equal(t.tau.view(np.int32),
                          cv.gather(1, (n - 1)[:, None]).squeeze(1).numpy().view(np.int32))
    assert np.array_equal(t.csum, csum.numpy()) and np.array_equal(t.total, csum[:, -1].numpy())
    assert np.array_equal(t.sorted_ids, sorted_ids.numpy())
    ref = F.kept_prefix_length(cv, kk, pp if use_p else None, mm if use_m else None, frac)
    assert np.array_equal(t.n, ref.numpy())  # the specification's kept prefix
