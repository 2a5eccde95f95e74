"""Exact sums and exact value counts (detsample/auditexact.py)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.audit.analysis.exact import (
    SCALE_BITS,
    ValueCounts,
    exact_marginal_sums,
    exact_mean,
    exact_sum,
    exact_sums,
    fraction_to_float,
    to_fraction,
)

SPECIAL = [
    0.0,
    -0.0,
    5e-324,
    -5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    -1.7976931348623157e308,
    1.0,
    -1.0,
    1e-300,
    3.0e-320,
]

QUANTILE_CASES = [
    # (values, extra zeros)
    ([0.5], 0),
    ([0.5], 3),
    ([1.0, 2.0, 3.0, 4.0], 0),
    ([1e-9, 1e-9, 1e-9, 2e-3, 0.7], 5),
    ([3.0, 1.0, 2.0, 2.0, 2.0, 9.0, 1e-300], 1),
]


def _merged(x: np.ndarray, parts: int) -> ValueCounts:
    """The multiset of x built as ``parts`` ValueCounts merged into one."""
    merged = ValueCounts()
    for p in np.array_split(x, parts):
        vc = ValueCounts()
        vc.add(p)
        merged.merge(vc)
    return merged


def _fraction_sum(x) -> Fraction:
    return sum((Fraction(v) for v in np.asarray(x, dtype=np.float64).tolist()), Fraction(0))


def test_exact_sum_special_values():
    """Pins subnormals (negative shifts) and the largest floats (no overflow in the integer)."""
    x = np.array(SPECIAL)
    assert to_fraction(exact_sum(x)) == _fraction_sum(x)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=200), st.integers(1, 5), st.integers(0, 2**31)
)
def test_exact_sums_equal_rational_sums(values, ngroups, seed):
    """Pins rounding in the per-exponent bins: every group sum equals the rational sum."""
    x = np.array(values, dtype=np.float64)
    g = np.random.default_rng(seed).integers(0, ngroups, x.size)
    sums = exact_sums(x, g, ngroups)
    for k in range(ngroups):
        assert to_fraction(sums[k]) == _fraction_sum(x[g == k])
    try:
        expected = math.fsum(values)
    except OverflowError:  # the exact sum exceeds the float range
        expected = math.inf if _fraction_sum(x) > 0 else -math.inf
    assert fraction_to_float(to_fraction(sum(sums))) == expected


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=300), st.integers(0, 2**31))
def test_marginal_sums_equal_rational_sums_per_axis(values, seed):
    """Pins the joint binning of the audit's buckets: per-(axis index, last index) sums
    of a (4, 3, 2) grid equal the rational sums of those values."""
    x = np.array(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    a, b, c = rng.integers(0, 4, x.size), rng.integers(0, 3, x.size), rng.integers(0, 2, x.size)
    first, second = exact_marginal_sums(x, (a * 3 + b) * 2 + c, (4, 3, 2))
    for i in range(4):
        for k in range(2):
            assert to_fraction(first[i * 2 + k]) == _fraction_sum(x[(a == i) & (c == k)])
    for j in range(3):
        for k in range(2):
            assert to_fraction(second[j * 2 + k]) == _fraction_sum(x[(b == j) & (c == k)])


def test_exact_sum_is_order_independent_bitwise():
    """Pins the audit's sharding guarantee: any split and order gives the same integer."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=10_000) * 10.0 ** rng.integers(-20, 20, 10_000)
    whole = exact_sum(x)
    perm = rng.permutation(x.size)
    parts = np.array_split(x[perm], 7)
    assert sum(exact_sum(p) for p in parts) == whole


def test_exact_sums_reject_non_finite():
    with pytest.raises(ValueError, match="finite"):
        exact_sum(np.array([1.0, np.inf]))


def test_exact_mean_rounds_once_and_handles_empty():
    x = np.array([0.1, 0.2, 0.3])
    assert exact_mean(exact_sum(x), 3) == float(_fraction_sum(x) / 3)
    assert exact_mean(0, 0) is None
    big = 1 << (SCALE_BITS + 1100)
    assert exact_mean(big, 1) == math.inf


@pytest.mark.parametrize("values,zeros", QUANTILE_CASES)
def test_quantiles_match_numpy_bitwise(values, zeros):
    """Pins the interpolation formula: bit-equal to np.quantile(method='linear')."""
    vc = ValueCounts()
    for part in np.array_split(np.array(values), 2):
        vc.add(part)
    qs = [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0]
    full = np.r_[np.zeros(zeros), values]
    assert vc.quantiles(qs, zeros) == [float(np.quantile(full, q)) for q in qs]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=300),
    st.integers(0, 20),
    st.integers(1, 6),
)
def test_value_counts_merge_is_exact(values, zeros, parts):
    """Pins merging: counts merged from any split give numpy's quantiles of the whole."""
    x = np.array(values)
    merged = _merged(x, parts)
    full = np.r_[np.zeros(zeros), x]
    qs = [0.5, 0.9, 0.99, 0.999]
    assert merged.quantiles(qs, zeros) == [float(np.quantile(full, q)) for q in qs]
    assert merged.total == x.size


def test_value_counts_reject_nan_and_fold_negative_zero():
    vc = ValueCounts()
    with pytest.raises(ValueError, match="NaN"):
        vc.add(np.array([-1.0, np.nan]))
    vc.add(np.array([-0.0, 0.0]))
    assert vc.values().tolist() == [0.0] and vc.counts.tolist() == [2]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(min_value=-800, max_value=800, allow_nan=False).filter(bool), min_size=1, max_size=300),
    st.integers(0, 20),
    st.integers(1, 5),
)
def test_signed_value_counts_give_numpy_quantiles_of_values_abs_and_exp(values, zeros, parts):
    """Pins the signed multiset: quantiles of d (zeros among them), of |d| (the two halves
    merged) and of r = exp(d) are bit-equal to np.quantile of the full arrays."""
    x = np.array(values)
    vc = _merged(x, parts)
    full = np.r_[np.zeros(zeros), x]
    qs = [0.0, 0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0]
    assert vc.quantiles(qs, zeros) == [float(np.quantile(full, q)) for q in qs]
    assert vc.abs_quantiles(qs, zeros) == [float(np.quantile(np.abs(full), q)) for q in qs]
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.exp(full)
        got = vc.quantiles(qs, zeros, transform=np.exp)
        want = [float(np.quantile(r, q)) for q in qs]
    assert np.array_equal(np.array(got), np.array(want), equal_nan=True)
    assert vc.total == x.size
    edges = np.array([0.0, 1e-3, 0.5, 1.0, 10.0, np.inf])
    want_hist = np.histogram(np.abs(x), bins=edges)[0]
    assert vc.abs_histogram(edges).tolist() == want_hist.tolist()


def test_value_counts_histogram_and_pickle():
    import pickle

    vc = ValueCounts()
    vc.add(np.array([1e-5, 2e-5, 0.5, 1.0, 10.0]))
    vc2 = pickle.loads(pickle.dumps(vc))
    assert vc2.histogram(np.array([0.0, 1e-4, 1.0, 10.0])).tolist() == [2, 1, 2]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.sampled_from([-2.0, -0.5, 0.25, 0.5, 3.0]) | st.floats(-5, 5), min_size=1, max_size=200),
    st.integers(0, 5),
)
def test_compacted_and_raw_multisets_agree(values, zeros):
    """Pins compaction: past the threshold the values are kept as distinct values with
    counts; quantiles, |d| quantiles, histograms and pickling give the same bits."""
    import pickle

    x = np.array(values) + 0.0
    raw = ValueCounts()
    raw.add(x)
    small = ValueCounts()
    small._COMPACT_AT = 7  # compacts every 7 values
    for p in np.array_split(x, 5):
        small.add(p)
    small = pickle.loads(pickle.dumps(small))
    qs = [0.0, 0.1, 0.5, 0.9, 1.0]
    edges = np.array([0.0, 0.3, 1.0, np.inf])
    assert small.quantiles(qs, zeros) == raw.quantiles(qs, zeros)
    assert small.abs_quantiles(qs, zeros) == raw.abs_quantiles(qs, zeros)
    assert small.abs_histogram(edges).tolist() == raw.abs_histogram(edges).tolist()
    assert small.values().tolist() == np.unique(x).tolist() and small.total == x.size


@pytest.mark.parametrize("value", [1 - 2.0**-53, -(1 - 2.0**-53), -0.5, 2.0**-1060])
def test_full_blocks_of_extreme_mantissas_stay_exact(value):
    """Pins the block bound: 2**17 values whose split parts are the largest possible,
    all in one cell of the largest grid (1024 cells), sum exactly."""
    x = np.full(1 << 17, value)
    groups = np.zeros(x.size, dtype=np.int64)
    first, second = exact_marginal_sums(x, groups, (16, 32, 2))
    want = Fraction(value) * x.size
    assert to_fraction(first[0]) == want and to_fraction(second[0]) == want
    assert to_fraction(exact_sum(x)) == want
