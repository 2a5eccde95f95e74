"""ops/nucleus.py: a top-p row's candidates by value (group maxima, a lower bound of the
threshold, the elements above it) and the bracket of its exact mass."""

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from detsample import arith, rules
from detsample.ops import filters as F
from detsample.ops import nucleus as N
from tests.ops.test_filters import NUCLEUS_FAMILIES, _family

FAMILIES = NUCLEUS_FAMILIES + ["huge", "tiny"]


def _rows(seed: int, family: str, rows: int, V: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    if family == "huge":  # magnitudes near float32's range: most masses are exactly 0
        z = torch.from_numpy((rng.standard_normal((rows, V)) * 1e30).astype(np.float32))
        return z - z.amax(1, keepdim=True)
    if family == "tiny":  # magnitudes around 2**-10, where lower_bound's first bin ends
        z = torch.from_numpy((rng.random((rows, V)) * -2e-3).astype(np.float32))
        return z - z.amax(1, keepdim=True)
    return _family(rng, rows, V, family)


@pytest.mark.parametrize("V", [1, 7, 8, 9, 64, 1003])
def test_group_maxima_are_the_strided_groups_maxima(V):
    z = torch.randn(3, V)
    got = N.group_maxima(z)
    W = V // N.GROUP
    want = [
        [max(z[r, j + i * W].item() for i in range(N.GROUP)) for j in range(W)] + z[r, N.GROUP * W :].tolist()
        for r in range(3)
    ]
    assert torch.equal(got, torch.tensor(want, dtype=torch.float32))


@given(st.integers(0, 2**32 - 1), st.sampled_from(FAMILIES), st.sampled_from([11, 100, 2000]))
def test_mass_bounds_bracket_the_exact_mass(seed, family, V):
    """lo <= Z <= hi for the rule's exact int64 mass, and the bracket is narrow
    (about 1e-6 of Z plus the V truncations). (A bracket without the truncations' and
    the roundings' margins fails here: the float sum of ``exp * 2**F`` exceeds the sum of
    its truncations by about V / 2.)"""
    z = _rows(seed, family, 4, V)
    frac = rules.frac_bits(V)
    exact = rules.mass(rules.floored_exp(z), frac).sum(-1)
    lo, hi = N.mass_bounds(z, frac)
    assert bool((lo <= exact).all()) and bool((exact <= hi).all()), (lo, exact, hi)
    width = (hi - lo).double()
    assert bool((width <= exact.double() * 1e-5 + 2 * V + 4).all()), (width, exact)


def _above_exact(z: torch.Tensor, thr: torch.Tensor, L: torch.Tensor, frac: int) -> torch.Tensor:
    """The survivors' exact mass strictly above L, over the full row."""
    q = rules.mass(rules.floored_exp(z), frac) * (z >= thr.unsqueeze(1)) * (z > L.unsqueeze(1))
    return q.sum(-1)


@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(FAMILIES),
    st.sampled_from([-1, 300]),
    st.sampled_from([0.3, 0.9, 0.99]),
    st.sampled_from([40, 2000, 2003]),
)
@example(0, "flat", -1, 0.99, 2000)
@example(0, "tiny", -1, 0.3, 2000)
def test_lower_bound_is_below_the_threshold(seed, family, k, p, V):
    """Where found, the survivors strictly above L fail the top-p test over the full
    row (so L is below the full sort's threshold); where not found, the maxima's whole
    survivor mass passes."""
    rows = 5
    z = _rows(seed, family, rows, V)
    frac = rules.frac_bits(V)
    kk = torch.full((rows,), V if k == -1 else k)
    pp = torch.full((rows,), p, dtype=torch.float64)
    thr = F.topk_threshold(z, kk)
    total = F.survivor_mass(z, thr, frac)
    limit = rules.top_p_limit(pp, total)
    maxima = N.group_maxima(z)
    L, found = N.lower_bound(maxima, thr.unsqueeze(1), limit, frac)
    tau = F.thresholds_by_sort(z, kk, pp, rules.element_tensor(rows), frac)
    a = _above_exact(z, thr, L, frac)
    assert bool((~rules.top_p_keeps(a[found], limit[found])).all())
    assert bool((L[found] < tau[found]).all())
    qm = rules.mass(arith.exp(maxima), frac) * (maxima >= thr.unsqueeze(1))
    assert bool(rules.top_p_keeps(qm.sum(-1)[~found], limit[~found]).all())


@given(st.integers(0, 2**32 - 1), st.sampled_from(FAMILIES), st.sampled_from([10, 17, 2003]))
def test_above_is_every_element_above_the_bound(seed, family, V):
    rows = 4
    z = _rows(seed, family, rows, V)
    L = torch.quantile(z.clamp(min=-1e30).double(), 0.9, dim=1).float()
    L[0] = float("-inf") if V < 20 else L[0]  # every finite element
    vals, ids = N.above(z, L, N.group_maxima(z))
    for r in range(rows):
        want = (z[r] > L[r]).nonzero().flatten()
        n = want.numel()
        assert torch.equal(vals[r, :n], torch.sort(z[r, want], descending=True).values)
        assert sorted(ids[r, :n].tolist()) == want.tolist()
        assert bool(torch.isneginf(vals[r, n:]).all())
        assert bool((ids[r, n:] == rules.PAD_ID).all())
        assert torch.equal(z[r, ids[r, :n]], vals[r, :n])  # each id carries its value
