"""The fused CPU passes (detsample/ops/rowpass.py, numba) are their torch compositions,
bit for bit.

Bugs they would catch: a scale by a reciprocal multiply or in float64 (one ulp off), a
group maximum over the wrong stride or a dropped tail column, a survivor cut on the
unclamped value, a histogram bin off by one, the bound's sign bit lost, a row's result
that depends on the thread split.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample import rules
from detsample.ops import filters, nucleus, rowpass
from detsample.ops.temperature import scale_logits

FAMILIES = ["randn", "ties", "neginf", "huge", "peaked"]


def _logits(rng, rows: int, V: int, family: str) -> torch.Tensor:
    x = rng.standard_normal((rows, V)).astype(np.float32) * 3
    if family == "ties":
        x = np.round(x)
    elif family == "neginf":
        x[rng.random((rows, V)) < 0.4] = -np.inf
        x[:, 0] = 1.0
    elif family == "huge":
        x *= np.float32(1e37)
    elif family == "peaked":
        x[:, rng.integers(0, V, rows)] += 25
    return torch.from_numpy(x)


def _z(x: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    m = x.amax(-1, keepdim=True)
    return torch.sub(x, m).div_(T)  # the torch composition of scale_logits


@given(st.integers(1, 6), st.integers(1, 300), st.integers(0, 2**31 - 1), st.sampled_from(FAMILIES))
def test_scale_is_sub_then_true_division(rows, V, seed, family):
    rng = np.random.default_rng(seed)
    x = _logits(rng, rows, V, family)
    T = torch.from_numpy(rng.choice([1e-3, 0.3, 0.8, 1.0, 1.7, 7.0], (rows, 1)).astype(np.float32))
    got = scale_logits(x, x.amax(-1, keepdim=True), T)
    assert rowpass.runs(x)
    assert torch.equal(got.view(torch.int32), _z(x, T).view(torch.int32))


@given(st.integers(1, 5), st.integers(1, 400), st.integers(0, 2**31 - 1), st.sampled_from(FAMILIES), st.booleans())
def test_mass_and_maxima_are_survivor_mass_and_group_maxima(rows, V, seed, family, cut):
    rng = np.random.default_rng(seed)
    z = _z(_logits(rng, rows, V, family), torch.full((rows, 1), 0.8))
    thr = torch.from_numpy(rng.choice(z.numpy().ravel(), rows)) if cut else None
    frac = rules.frac_bits(V)
    total, maxima = rowpass.mass_and_maxima(z, thr, frac, nucleus.GROUP)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rules, "fused_masses", lambda t: False)
        want = filters.survivor_mass(z, thr, frac)
        want_max = nucleus.group_maxima(z)
    assert torch.equal(total, want)
    assert torch.equal(maxima, want_max)  # values (a +0.0 / -0.0 tie is not told apart)


@given(
    st.integers(1, 5),
    st.integers(8, 3000),
    st.integers(0, 2**31 - 1),
    st.sampled_from(FAMILIES),
    st.booleans(),
    st.sampled_from([0.0, 0.3, 0.9, 0.999]),
)
def test_lower_bound_is_the_torch_histograms(rows, V, seed, family, cut, top_p):
    rng = np.random.default_rng(seed)
    z = _z(_logits(rng, rows, V, family), torch.full((rows, 1), 0.7))
    maxima = nucleus.group_maxima(z)
    thr = torch.from_numpy(rng.choice(z.numpy().ravel(), rows)).unsqueeze(1) if cut else None
    frac = rules.frac_bits(V)
    total = filters.survivor_mass(z, None if thr is None else thr.squeeze(1), frac)
    limit = rules.top_p_limit(torch.full((rows,), top_p, dtype=torch.float64), total)
    L, found = nucleus.lower_bound(maxima, thr, limit, frac)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rowpass, "lower_bound", lambda *a, **k: None)
        L2, found2 = nucleus.lower_bound(maxima, thr, limit, frac)
    assert torch.equal(found, found2)
    assert torch.equal(L.view(torch.int32)[found], L2.view(torch.int32)[found2])


def test_threads_change_no_bit():
    x = _logits(np.random.default_rng(1), 16, 70000, "peaked")
    T = torch.full((16, 1), 0.8)
    prev = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            z = scale_logits(x, x.amax(-1, keepdim=True), T)
            outs.append((z, *rowpass.mass_and_maxima(z, None, 40, 8)))
    finally:
        torch.set_num_threads(prev)
    for o in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(o, outs[0]))


def test_not_a_float32_cpu_tensor_takes_the_torch_composition():
    z = torch.zeros(2, 16, dtype=torch.float64)
    assert rowpass.mass_and_maxima(z, None, 40, 8) is None
    assert rowpass.scale(z, z[:, :1], z[:, :1] + 1, None) is None
    assert rowpass.mass_and_maxima(torch.zeros(2, 16), None, 40, 4) is None  # groups of 4
    assert math.isfinite(float(scale_logits(z, z[:, :1], z[:, :1] + 1).sum()))


@given(
    st.integers(1, 5),
    st.integers(1, 3000),
    st.integers(0, 2**31 - 1),
    st.sampled_from(FAMILIES),
    st.booleans(),
    st.booleans(),
)
def test_lazy_blocked_draw_is_the_materialised_one(rows, V, seed, family, cut, min_p):
    """A blocked table whose masses are not materialised draws the tokens of the one
    whose masses are (a block recomputed per row): ties at the cuts, a short last block,
    targets at block boundaries. Bug it would catch: a block found with ``<`` for
    ``<=`` (a token of the next block), the block's base mass off by one block."""
    from detsample.ops import draw

    rng = np.random.default_rng(seed)
    z = _z(_logits(rng, rows, V, family), torch.full((rows, 1), 0.9))
    tau = torch.from_numpy(rng.choice(z.numpy().ravel(), rows)) if cut else torch.full((rows,), -math.inf)
    element = rules.element_tensor(rows, min_p=torch.full((rows,), 0.05 if min_p else 0.0))
    frac = rules.frac_bits(V)
    q, bsum = draw.block_cdf(z, tau, element, frac)
    lazy, bsum2 = draw.block_cdf(z, tau, element, frac, lazy=True)
    assert isinstance(lazy, rowpass.LazyMasses) and torch.equal(bsum, bsum2)
    total = bsum[:, -1]
    for u in [1e-9, 0.25, 0.5, 0.999999]:
        us = torch.full((rows,), u, dtype=torch.float64)
        assert torch.equal(draw.draw_by_blocks(q, bsum, us), draw.draw_by_blocks(lazy, bsum, us))
    # targets exactly at block boundaries
    edge = bsum[:, :1].squeeze(1).clamp(max=total - 1)
    us = ((edge.double() + 0.5) / total.double()).clamp(1e-12, 1 - 1e-12)
    assert torch.equal(draw.draw_by_blocks(q, bsum, us), draw.draw_by_blocks(lazy, bsum, us))
