"""Bitwise comparison and ULP distances (detsample/probe/compare.py).

Pins: a comparison that calls -0.0 and 0.0 (or two NaN patterns) equal, a ULP distance
that is off by one across zero or at a binade edge, or a ``diff`` that reports a
difference where the bits agree (or none where they differ).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample.probe.compare import bits_equal, diff

FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _next_up(x: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(x, torch.full_like(x, math.inf))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_neighbours_are_one_ulp_apart(dtype):
    x = torch.tensor([-3.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 2.0, 1000.0], dtype=dtype)
    d = diff(x, _next_up(x))
    assert not d.equal and d.count == x.numel() and d.max_ulp == 1


def test_across_zero_counts_every_representable_value():
    tiny = torch.tensor([1.4e-45])  # the smallest float32 subnormal
    assert diff(-tiny, tiny).max_ulp == 2
    assert diff(torch.tensor([-0.0]), torch.tensor([0.0])).max_ulp == 0


def test_signed_zero_and_nan_patterns_are_bits():
    assert not bits_equal(torch.tensor([-0.0]), torch.tensor([0.0]))
    nan = torch.tensor([math.nan])
    assert bits_equal(nan, nan.clone())
    other = torch.tensor(np.array([0x7FC00001], dtype=np.int32)).view(torch.float32)
    assert not bits_equal(nan, other)
    d = diff(torch.tensor([-0.0]), torch.tensor([0.0]))
    assert not d.equal and d.count == 1


def test_integers_and_mismatched_shapes():
    d = diff(torch.tensor([3, 7, 9]), torch.tensor([3, 4, 9]))
    assert (d.equal, d.count, d.max_ulp, d.max_abs) == (False, 1, 3, 3.0)
    assert diff(torch.tensor([1, 2]), torch.tensor([1, 2])).equal
    with pytest.raises(ValueError, match=r"cannot compare torch.float32\[2\] with torch.float32\[3\]"):
        diff(torch.zeros(2), torch.zeros(3))
    assert not bits_equal(torch.zeros(2), torch.zeros(2, dtype=torch.float64))


@given(st.floats(allow_nan=False, allow_infinity=False, width=32), st.integers(0, 40))
def test_ulp_distance_counts_steps(x, k):
    """k nextafter steps up from x are k ULPs, across zero too (-0.0 and 0.0 are one
    value); the distance is symmetric."""
    a = torch.tensor([x], dtype=torch.float32)
    b = a.clone()
    for _ in range(k):
        b = _next_up(b)
    if math.isinf(b.item()):
        return
    assert diff(a, b).max_ulp == diff(b, a).max_ulp == k
