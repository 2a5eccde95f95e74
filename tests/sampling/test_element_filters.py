"""A new element-wise filter is a registry entry: every torch strategy of step 8 reads
``rules.ELEMENT_FILTERS`` and the batch's one ``(B, F)`` parameter tensor, never a filter
by name.

The proof registers a hypothetical fourth threshold filter, an ``epsilon`` cut (keep
``exp(z) >= epsilon``), in a test-local extension of the registry (the package is not
edited) and a ``SamplingParams`` subclass with its field, then checks that the bounded
candidates, the full strategy (block CDF, the large top-k's k-th value), the radix
select, the allowed-columns draw and the kept mask of the "processed" logprobs all apply
it, and agree bit for bit with each other and with the full stable sort. Because its
test is min-p's, a row with ``(min_p=a, epsilon=b)`` must give the bits of a row with
``min_p=max(a, b)`` and no epsilon: the reference the extension is checked against.

Bug it pins: a strategy (or the batch, the plan, a kernel wrapper) that still names
min-p: the new filter would be silently skipped there, its rows keeping too much.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from detsample import Request, Sampler, SamplingBatch, SamplingParams, rules
from detsample.ops import colcdf, radix
from detsample.ops import draw as draw_ops
from detsample.ops import filters as filter_ops
from tests.helpers import logits_rows

V = 4096  # keptset.SELECT_MIN_V: a flat nucleus spills to the radix select
EPSILON = rules.ElementFilter("epsilon", 0.0, lambda e, eps: e >= eps)


@dataclass(frozen=True)
class EpsParams(SamplingParams):
    """SamplingParams with the hypothetical filter's field."""

    epsilon: float = 0.0


@pytest.fixture
def with_epsilon(monkeypatch):
    """The registry extended by the epsilon cut (undone after the test)."""
    monkeypatch.setattr(rules, "ELEMENT_FILTERS", rules.ELEMENT_FILTERS + (EPSILON,))


#: (params, epsilon): one row per strategy; the min-p / epsilon pairs cross so that the
#: columns cannot be swapped unnoticed
ROWS = [
    (dict(top_p=0.9, temperature=1.5), 0.02),  # flat nucleus: spills, select
    (dict(top_p=0.8, temperature=0.7), 0.1),  # nucleus on candidates
    (dict(top_k=20, top_p=0.95, min_p=0.3), 0.05),  # small top-k, bounded
    (dict(top_k=12, min_p=0.02), 0.25),  # small top-k alone, bounded
    (dict(top_k=3000, temperature=0.9), 0.05),  # large top-k: k-th value, full
    (dict(top_k=3000, top_p=0.97, min_p=0.05), 0.01),  # large top-k with top-p
    (dict(temperature=0.8), 0.2),  # plain: block CDF
    (dict(temperature=1.2, min_p=0.1), 0.0),  # epsilon neutral
    (dict(temperature=0.0), 0.5),  # greedy: untouched
]


def _batches(seed, mode="processed_fixed"):
    """The rows with the epsilon field, their twins with ``min_p = max(min_p, epsilon)``,
    and the rows with epsilon at its neutral value."""
    eps, twin, off = [], [], []
    for i, (kw, e) in enumerate(ROWS):
        kw = dict(kw, seed=seed + i, logprobs_mode=mode, logprobs=3)
        eps.append(EpsParams(epsilon=e, **kw))
        twin.append(EpsParams(**dict(kw, min_p=max(kw.get("min_p", 0.0), e))))
        off.append(EpsParams(**kw))
    return [SamplingBatch.from_requests([Request(str(i), p) for i, p in enumerate(ps)], V) for ps in (eps, twin, off)]


def _same(a, b):
    assert torch.equal(a.token_ids, b.token_ids)
    assert torch.equal(a.logprobs.view(torch.int32), b.logprobs.view(torch.int32))
    assert torch.equal(a.top_logprobs[0].view(torch.int32), b.top_logprobs[0].view(torch.int32))
    assert torch.equal(a.top_logprobs[1], b.top_logprobs[1])


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("mode", ["processed_fixed", "processed"])
def test_a_registered_filter_is_applied_by_every_strategy(with_epsilon, seed, mode):
    """Tokens, logprobs of the final distribution (which read the kept mass and the kept
    mask) and kept sets: the epsilon rows equal their min-p twins, under the default
    strategies and under the full sort, and the epsilon cuts something. The bounded
    candidates and the radix select must actually see the two columns (spied)."""
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(logits_rows(rng, len(ROWS), V, "random"))
    x[0] = torch.from_numpy(rng.standard_normal(V).astype(np.float32) * 0.3)  # flat
    pos = torch.from_numpy(rng.integers(0, 1000, len(ROWS)))
    eps, twin, off = _batches(seed, mode)
    seen = {"bounded": [], "select": []}
    real_prefix, real_select = filter_ops.kept_prefix, radix.thresholds_by_select

    def prefix(vals, cut, frac):
        seen["bounded"].append(None if cut.element is None else cut.element.shape[1])
        return real_prefix(vals, cut, frac)

    def select(z, k, p, element, frac, **scratch):
        seen["select"].append(element.shape[1])
        return real_select(z, k, p, element, frac, **scratch)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(filter_ops, "kept_prefix", prefix)
        mp.setattr(radix, "thresholds_by_select", select)
        got = Sampler().sample(x, eps, pos)
        mask = Sampler().sampling_mask(x, eps)
    assert 2 in seen["bounded"] and seen["select"] and set(seen["select"]) == {2}
    for sampler in (Sampler(), Sampler(filter_impl="sort")):
        _same(sampler.sample(x, twin, pos), got)
        _same(sampler.sample(x, eps, pos), got)
        assert torch.equal(sampler.sampling_mask(x, twin), mask)
    assert not torch.equal(Sampler().sampling_mask(x, off), mask)  # epsilon cuts
    lp = Sampler().compute_logprobs(x, eps, got.token_ids)
    assert torch.equal(lp.view(torch.int32), got.logprobs.view(torch.int32))


def test_the_ops_read_every_column(with_epsilon):
    """Op by op, a (rows, 2) parameter tensor (min-p, epsilon) gives the bits of one whose
    min-p column is the larger of the two: the sort's threshold, the radix select's, the
    candidates' kept prefix, the block CDF and the allowed columns' CDF."""
    rng = np.random.default_rng(7)
    rows = 6
    z = torch.from_numpy(logits_rows(rng, rows, V, "random"))
    z = z - z.amax(-1, keepdim=True)
    frac = rules.frac_bits(V)
    mp = torch.tensor([0.0, 0.3, 0.02, 0.0, 0.1, 0.0])
    ep = torch.tensor([0.2, 0.05, 0.25, 0.0, 0.1, 0.01])
    both = rules.element_tensor(rows, min_p=mp, epsilon=ep)
    twin = rules.element_tensor(rows, min_p=torch.maximum(mp, ep))
    k = torch.tensor([V, 40, V, 7, 3000, V], dtype=torch.int32)
    p = torch.tensor([0.9, 1.0, 0.95, 1.0, 0.99, 1.0], dtype=torch.float64)
    tau = filter_ops.thresholds_by_sort(z, k, p, twin, frac)
    assert not torch.equal(
        tau, filter_ops.thresholds_by_sort(z, k, p, rules.element_tensor(rows, min_p=mp), frac)
    )  # epsilon moves some threshold
    for by in (filter_ops.thresholds_by_sort, radix.thresholds_by_select):
        assert torch.equal(by(z, k, p, both, frac).view(torch.int32), tau.view(torch.int32))
    sz = torch.sort(z, dim=-1, descending=True).values
    n = filter_ops.kept_prefix_length(sz, k, p, both, frac)
    assert torch.equal(sz.gather(1, (n - 1)[:, None])[:, 0], tau)
    q, bsum = draw_ops.block_cdf(z.clone(), tau, both, frac)
    q2, bsum2 = draw_ops.block_cdf(z.clone(), tau, twin, frac)
    assert torch.equal(q, q2) and torch.equal(bsum, bsum2)
    ids = torch.arange(V).expand(rows, V)
    ones = torch.ones((rows, 1))
    _, csum = colcdf.column_cdf(z, ids, torch.zeros((rows, 1)), ones, both, frac)
    _, csum2 = colcdf.column_cdf(z, ids, torch.zeros((rows, 1)), ones, twin, frac)
    assert torch.equal(csum, csum2)
    q0, _ = draw_ops.block_cdf(z.clone(), torch.full((rows,), float("-inf")), both, frac)
    assert torch.equal(csum[:, -1], q0.sum(-1))
