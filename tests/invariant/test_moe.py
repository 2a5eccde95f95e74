"""MoE kernels of the mode: the router's top-k and the grouped expert products.

Pins: a top-k whose order of tied scores follows the batch (torch leaves it unspecified;
bfloat16 routers tie), a NaN score that is not treated as the largest, a grouped product
whose rows depend on how many tokens the batch sent to an expert, rows past the last group
left uninitialised, and an unsupported grouped form computed silently.
"""

from __future__ import annotations

import pytest
import torch

from detsample.invariant import batch_invariant, moe
from detsample.invariant.verify import NotInvariantError


@pytest.mark.parametrize("largest", [True, False])
def test_topk_breaks_ties_by_lowest_index(largest):
    x = torch.tensor([[0.5, 2.0, 2.0, -1.0, 2.0, 0.5]]).bfloat16()
    vals, idx = moe.topk(x, 4, -1, largest, True)
    if largest:
        assert idx.tolist() == [[1, 2, 4, 0]] and vals.float().tolist() == [[2.0, 2.0, 2.0, 0.5]]
    else:
        assert idx.tolist() == [[3, 0, 5, 1]]
    wide = torch.cat([x, x]).repeat(1, 3)  # the same row, twice
    v2, i2 = moe.topk(wide, 5, 1, largest, True)
    assert torch.equal(i2[0], i2[1])


def test_topk_orders_nan_first_and_checks_k():
    x = torch.tensor([1.0, float("nan"), 3.0])
    vals, idx = moe.topk(x, 2, 0, True, True)
    assert idx.tolist() == [1, 2] and torch.isnan(vals[0])
    with pytest.raises(RuntimeError, match="k out of range"):
        moe.topk(x, 4, 0, True, True)


def test_the_mode_routes_torch_topk_here():
    x = torch.zeros(3, 8)
    with batch_invariant():
        assert torch.topk(x, 3).indices.tolist() == [[0, 1, 2]] * 3


@pytest.mark.parametrize("portable", [False, True])
def test_grouped_products_are_per_group_and_row_invariant(portable):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(23, 16, generator=g)
    w = torch.randn(4, 16, 12, generator=g)
    offs = torch.tensor([5, 5, 17, 21], dtype=torch.int32)  # group 1 empty, 2 rows past the end
    with batch_invariant(portable=portable):
        out = moe.grouped_mm(x, w, offs)
        assert torch.equal(out[21:], torch.zeros(2, 12))
        for lo, hi, e in ((0, 5, 0), (5, 17, 2), (17, 21, 3)):
            assert torch.equal(out[lo:hi], torch.mm(x[lo:hi], w[e]))
            for r in range(lo, hi):  # a row alone in its group
                one = moe.grouped_mm(x[r : r + 1], w, torch.tensor([0] * e + [1] * (4 - e), dtype=torch.int32))
                assert torch.equal(one[0], out[r])
        batched = moe.grouped_mm(x[:8].view(2, 4, 16), w[:2], None)
        assert torch.equal(batched[1], torch.mm(x[4:8], w[1]))


def test_unsupported_grouped_forms_are_named_errors():
    x = torch.randn(6, 4)
    with pytest.raises(NotInvariantError, match="2-D by a 2-D"):
        moe.grouped_mm(x, torch.randn(4, 5), torch.tensor([2, 6], dtype=torch.int32))
    with pytest.raises(NotInvariantError, match="bias"):
        moe.grouped_mm(x, torch.randn(2, 4, 5), torch.tensor([2, 6], dtype=torch.int32), torch.zeros(2, 5))
