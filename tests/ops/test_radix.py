"""Tests of detsample/ops/radix.py: the sort's thresholds by a radix select.

The select must give :func:`thresholds_by_sort`'s threshold bit for bit on every row.
Pins: a bin's running sum taken inclusive (the mass *at* a value counted as above it,
which drops a tie group the sort keeps), the threshold taken from the wrong end of the
passing bins, the mass of a top-k casualty counted, a threshold of ``0.0`` where the sort's is ``-0.0``,
and a row with a positive value (not max-shifted) read with the wrong order instead of
going to the sort.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import rules
from detsample.ops import filters as F
from detsample.ops.radix import thresholds_by_select

FAMILIES = ["flat", "gaussian", "peaked", "ties", "coarse", "neginf", "tiny", "huge", "bf16"]


def _rows(rng, n, V, family):
    x = rng.standard_normal((n, V))
    if family == "gaussian":
        x *= 3
    elif family == "peaked":
        x *= 2
        x[:, : min(8, V)] += 12
    elif family == "ties":
        x = np.round(x)
    elif family == "coarse":
        x = np.round(x * 4) / 4
    elif family == "neginf":
        x[rng.random((n, V)) < 0.6] = -np.inf
        x[:, 0] = 0.5
    elif family == "tiny":  # denormal exps and masses that truncate to 0
        x *= 60
    elif family == "huge":
        x *= 1e30
    elif family == "bf16":
        x = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).double().numpy()
    x = x.astype(np.float32)
    z = x - x.max(1, keepdims=True)  # max-shifted, as the cut sees it
    return torch.from_numpy(z.astype(np.float32))


@settings(max_examples=120, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([7, 300, 4099]),
    st.sampled_from(FAMILIES),
    st.lists(
        st.tuples(
            st.sampled_from([-1, 1, 2, 5, 40, 1000]),
            st.sampled_from([1.0, 0.999, 0.9, 0.5, 0.1, 1e-9]),
            st.sampled_from([0.0, 0.0, 0.05, 0.5, 1.0]),
        ),
        min_size=1,
        max_size=5,
    ),
)
def test_select_is_bitwise_the_sort(seed, V, family, filters):
    """Property: any rows, any top-k / top-p / min-p: the same thresholds, bit for bit."""
    rng = np.random.default_rng(seed)
    z = _rows(rng, len(filters), V, family)
    kk = torch.tensor([V if k == -1 else k for k, _, _ in filters])
    pp = torch.tensor([p for _, p, _ in filters], dtype=torch.float64)
    mm = rules.element_tensor(len(filters), min_p=torch.tensor([m for _, _, m in filters], dtype=torch.float32))
    frac = rules.frac_bits(V)
    want = F.thresholds_by_sort(z, kk, pp, mm, frac)
    got = thresholds_by_select(z, kk, pp, mm, frac)
    assert torch.equal(want.view(torch.int32), got.view(torch.int32)), (want, got)


CASES = [  # (row, top_k, top_p): hand-made edges
    ([0.0, -1.0, -1.0, -1.0, -5.0], 5, 0.5),  # the tie group at the cut is kept whole
    ([0.0, -0.0, -1.0], 3, 0.3),  # -0.0 and 0.0 are one value
    ([0.0, -1e-30, -1e-45, -np.inf, -np.inf], 5, 0.999999),
    ([0.0] * 6, 6, 0.01),  # all tied
    ([0.0, -1.0, -2.0, -3.0], 2, 0.9999),  # top-k casualties must not count
]


@pytest.mark.parametrize("row,k,p", CASES)
def test_edge_rows(row, k, p):
    z = torch.tensor([row], dtype=torch.float32)
    args = (
        torch.tensor([k]),
        torch.tensor([p], dtype=torch.float64),
        rules.element_tensor(1),
        rules.frac_bits(len(row)),
    )
    assert torch.equal(
        F.thresholds_by_sort(z, *args).view(torch.int32), thresholds_by_select(z, *args).view(torch.int32)
    )


def test_rows_that_are_not_max_shifted_go_to_the_sort():
    z = torch.tensor([[2.0, 1.0, -3.0, 0.5]])
    args = (torch.tensor([4]), torch.tensor([0.6], dtype=torch.float64), rules.element_tensor(1), rules.frac_bits(4))
    assert torch.equal(F.thresholds_by_sort(z, *args), thresholds_by_select(z, *args))


def test_no_rows():
    z = torch.empty(0, 10)
    e = torch.empty(0)
    assert thresholds_by_select(z, e.long(), e.double(), rules.element_tensor(0), 4).shape == (0,)
