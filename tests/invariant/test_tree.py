"""The portable row sum: one fixed tree of IEEE additions, bit for bit the oracle.

Pins: a tree that pairs elements differently for some lengths (not powers of two), a
padding that turns -0.0 into +0.0 or adds a rounding, and a sum whose bits follow the
other rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.invariant.tree import tree_sum
from oracles import invariant as oracle


@settings(max_examples=60, deadline=None)
@given(
    r=st.integers(1, 4),
    n=st.integers(0, 700),
    scale=st.sampled_from([1.0, 1e-30, 1e30, 1e38]),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_tree_sum_is_the_oracle_bit_for_bit(r, n, scale, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(r, n, generator=g, dtype=torch.float64) * scale).to(dtype)
    got = tree_sum(x)
    want = np.array([oracle.tree_sum(x[i].numpy()) for i in range(r)], dtype=x.numpy().dtype)
    assert np.array_equal(got.numpy(), want, equal_nan=True)
    for i in range(r):
        assert np.array_equal(tree_sum(x[i : i + 1]).numpy(), got[i : i + 1].numpy(), equal_nan=True)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 9])
def test_signed_zeros_and_specials(n):
    neg = torch.full((1, n), -0.0)
    assert torch.equal(
        tree_sum(neg).view(torch.int32), torch.tensor([oracle.tree_sum(neg[0].numpy())]).view(torch.int32)
    )
    x = torch.ones(2, n)
    x[0, 0], x[1, -1] = float("inf"), float("nan")
    s = tree_sum(x)
    assert s[0] == float("inf") and torch.isnan(s[1])


def test_the_order_is_the_tree_not_left_to_right():
    """1 + 2**24 + 1 + ... : left to right loses every 1; the tree pairs them first."""
    x = torch.tensor([[2.0**24, 1.0, 1.0, 1.0]])
    assert float(tree_sum(x)) == 2.0**24 + 2  # (2^24 + 1) + (1 + 1): one 1 lost
    assert float(oracle.tree_sum(x[0].numpy())) == 2.0**24 + 2
