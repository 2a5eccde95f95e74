"""The top-K selection kernel (detsample/ops/selectjit.py) is the prefix of a stable
descending sort, values and ids, bit for bit; ``select.topk`` has torch.topk's values.

Bugs it would catch: a group bound taken from fewer than K groups (an element above it
missed), the ``n % 8`` tail columns never offered, a tie at the K-th value resolved to a
higher id, -0.0 and 0.0 ordered by their bits, a heap that pops a larger value before a
smaller one, a NaN row returned as if it were ordered, rows split over threads giving
other rows' answers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.ops import logprobs, select

FAMILIES = ["randn", "ties", "neginf", "zeros", "huge", "ascending", "descending", "constant", "peaked"]


def _rows(rng, rows: int, n: int, family: str) -> torch.Tensor:
    x = rng.standard_normal((rows, n)).astype(np.float32) * 3
    if family == "ties":
        x = np.round(x)
    elif family == "neginf":
        x = np.round(x)
        x[rng.random((rows, n)) < 0.6] = -np.inf
    elif family == "zeros":  # -0.0 and 0.0 tie (a sort compares, never reads bits)
        x = np.where(rng.random((rows, n)) < 0.5, np.float32(-0.0), np.float32(0.0))
        x[rng.random((rows, n)) < 0.1] = -1.0
    elif family == "huge":
        x *= np.float32(1e37)
    elif family == "ascending":
        x = np.sort(x, axis=-1)
    elif family == "descending":
        x = -np.sort(x, axis=-1)
    elif family == "constant":
        x[:] = 2.5
    elif family == "peaked":
        x[:, rng.integers(0, n, rows)] += 25
    return torch.from_numpy(np.ascontiguousarray(x))


def _stable(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    v, i = torch.sort(x, dim=-1, descending=True, stable=True)
    return v[:, :k], i[:, :k]


def _same(got, want) -> None:
    assert torch.equal(got[0].view(torch.int32), want[0].view(torch.int32))
    assert torch.equal(got[1], want[1])


@settings(max_examples=150)
@given(
    st.integers(1, 5), st.integers(1, 2000), st.integers(1, 300), st.integers(0, 2**31 - 1), st.sampled_from(FAMILIES)
)
def test_stable_topk_is_the_stable_sorts_prefix(rows, n, k, seed, family):
    x = _rows(np.random.default_rng(seed), rows, n, family)
    got = select.stable_topk(x, k)
    assert got is not None
    _same(got, _stable(x, min(k, n)))


@pytest.mark.parametrize(
    ("n", "k"),
    [
        (32000, 51),  # the group bound (n // 8 >= 2k)
        (32003, 51),  # and a tail of n % 8 columns
        (152064, 1),
        (4096, 256),  # W = 2k exactly
        (4095, 256),  # W < 2k: the heap over the whole row
        (16, 16),  # k = n
    ],
)
@pytest.mark.parametrize("family", ["randn", "ties", "neginf", "zeros", "ascending"])
def test_stable_topk_on_vocabulary_rows(n, k, family):
    x = _rows(np.random.default_rng(n + k), 3, n, family)
    _same(select.stable_topk(x, k), _stable(x, k))


def test_a_tie_at_the_kth_value_keeps_the_lowest_ids():
    x = torch.zeros(1, 4000)
    x[0, 100:110] = 5.0
    x[0, [7, 3999, 2000, 50]] = 1.0  # four tied at k = 12: ids 7 and 50 come first
    v, i = select.stable_topk(x, 12)
    assert i[0, 10:].tolist() == [7, 50]
    assert i[0, :10].tolist() == list(range(100, 110))


def test_a_row_with_a_nan_takes_torchs_path():
    x = torch.randn(3, 5000)
    x[1, 17] = float("nan")
    assert select.stable_topk(x, 8) is None
    v, i = select.topk(x, 8)
    tv, ti = torch.topk(x, 8, dim=-1)
    assert torch.equal(v.view(torch.int32), tv.view(torch.int32))


def test_rows_split_over_threads_are_each_rows_own(monkeypatch):
    x = _rows(np.random.default_rng(3), 24, 20000, "ties")  # 480,000 elements: split
    one = select.stable_topk(x, 40)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    _same(one, select.stable_topk(x, 40))
    _same(one, _stable(x, 40))


def test_topk_values_are_torchs():
    x = _rows(np.random.default_rng(5), 4, 9000, "ties")
    v, _ = select.topk(x, 77)
    tv, _ = torch.topk(x, 77, dim=-1)
    assert torch.equal(v.view(torch.int32), tv.view(torch.int32))


def test_non_cpu_float32_inputs_and_empty_rows_take_torch():
    x = torch.randn(2, 100, dtype=torch.float64)
    assert select.stable_topk(x, 5) is None
    assert select.stable_topk(torch.empty(3, 0), 5) is None
    assert select.stable_topk(torch.empty(0, 7), 5)[0].shape == (0, 5)
    v, i = select.topk(x, 5)
    assert torch.equal(v, torch.topk(x, 5).values)


@pytest.mark.parametrize("family", ["ties", "zeros", "neginf"])
def test_top_logprobs_order_is_the_stable_sorts_on_both_paths(family, monkeypatch):
    x = _rows(np.random.default_rng(11), 6, 3000, family)
    fast = logprobs.topn(x, 20)
    monkeypatch.setattr(select, "stable_topk", lambda *a: None)
    _same(fast, logprobs.topn(x, 20))
    _same(fast, _stable(x, 20))
