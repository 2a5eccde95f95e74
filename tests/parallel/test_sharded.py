"""The split-K portable product and the exact collectives, ranks simulated by threads.

:func:`detsample.invariant.sharded.split_k_matmul` over any split of K (uneven, random,
empty shards included) gives bitwise the single product
(:func:`detsample.invariant.exact.matmul`), zero and non-finite rows included; with
shares rounded before the sum, or a float sum of per-rank products, it does not (the negative
controls: what the exact combine is for). The rank processes themselves are tested in
test_tp_model.py; here the arithmetic, fast, over many inputs.
"""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample.invariant import exact
from detsample.invariant.sharded import Reduce, concat_last, owner_rows, split_k_fixed_b, split_k_matmul


class ThreadGroup:
    """``world`` threads as ranks: in-place collectives over a barrier."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=30)
        self.slots: list = [None] * world

    def _exchange(self, rank: int, t: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = t.clone()
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()
        return got

    def reduce(self, rank: int) -> Reduce:
        def max_(t):
            got = self._exchange(rank, t)
            t.copy_(torch.stack(got).amax(0))

        def sum_(t):
            assert t.dtype == torch.int64
            got = self._exchange(rank, t)
            t.copy_(torch.stack(got).sum(0))

        return Reduce(max_=max_, sum_=sum_, gather=lambda t: self._exchange(rank, t))

    def run(self, fn) -> list:
        out: list = [None] * self.world
        errors: list = []

        def body(r):
            try:
                out[r] = fn(r, self.reduce(r))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            raise errors[0]
        return out


def _split_matmul(a: torch.Tensor, b: torch.Tensor, cuts: list[int]) -> list[torch.Tensor]:
    bounds = [0, *cuts, a.shape[1]]
    group = ThreadGroup(len(bounds) - 1)

    def rank(r, reduce):
        lo, hi = bounds[r], bounds[r + 1]
        fb = split_k_fixed_b(b[lo:hi], reduce)
        return split_k_matmul(a[:, lo:hi], fb, reduce)

    return group.run(rank)


def _operands(seed: int, m: int, k: int, n: int, scale: float):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g) * torch.logspace(-3, 3, m).unsqueeze(1) * scale
    b = torch.randn(k, n, generator=g) * 0.05
    return a, b


@given(
    seed=st.integers(0, 2**31 - 1),
    m=st.integers(1, 6),
    k=st.integers(2, 700),
    n=st.integers(1, 9),
    world=st.integers(2, 4),
    data=st.data(),
)
def test_any_k_split_equals_the_single_product_bitwise(seed, m, k, n, world, data):
    a, b = _operands(seed, m, k, n, 1.0)
    cuts = sorted(data.draw(st.lists(st.integers(0, k), min_size=world - 1, max_size=world - 1)))
    want = exact.matmul(a, b)
    for got in _split_matmul(a, b, cuts):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), cuts


@pytest.mark.parametrize(
    "case", ["zero row on one rank", "nan in one shard", "inf in B", "k over a chunk, large values"]
)
def test_split_keeps_the_special_rows(case):
    a, b = _operands(3, 4, 600 if "chunk" in case else 64, 5, 1e6 if "chunk" in case else 1.0)
    k = a.shape[1]
    if case == "zero row on one rank":  # a rank whose share is exactly zero
        a[1, : k // 2] = 0.0
        a[1] *= 1e-3
    elif case == "nan in one shard":
        a[2, 3] = float("nan")
    elif case == "inf in B":
        b[k - 1, 2] = float("inf")
    want = exact.matmul(a, b)
    for got in _split_matmul(a, b, [k // 2]):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_negative_control_rounded_shares_or_float_sums_differ():
    """Without the exact combination -- each rank rounding its share to float32 before
    the sum, or float32 sums of per-rank products -- some element differs from the single
    product."""
    a, b = _operands(5, 8, 256, 16, 1.0)
    a[:, 128:] *= 1e-3
    want = exact.matmul(a, b)
    local = exact.matmul(a[:, :128], b[:128]).double() + exact.matmul(a[:, 128:], b[128:]).double()
    assert not torch.equal(local.float(), want)
    floats = a[:, :128] @ b[:128] + a[:, 128:] @ b[128:]
    assert not torch.equal(floats, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_owner_rows_give_the_table_bits_negative_zero_included(dtype):
    g = torch.Generator().manual_seed(0)
    table = torch.randn(12, 5, generator=g).to(dtype)
    table[7, 1] = -0.0
    table[2, 0] = float("nan")
    ids = torch.tensor([[7, 0, 11, 2, 7], [5, 6, 1, 10, 3]])
    want = torch.nn.functional.embedding(ids, table)
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    group = ThreadGroup(3)
    outs = group.run(lambda r, reduce: owner_rows(ids, table[4 * r : 4 * r + 4], 4 * r, reduce))
    for got in outs:
        assert torch.equal(got.view(bits), want.view(bits))
    # a float sum with zeros (Megatron's) loses the sign of -0.0: the reason for the bit sum
    assert (want[0, 0, 1] + 0.0).view(bits) != want[0, 0, 1].view(bits)


def test_concat_last_is_rank_order():
    x = torch.arange(24.0).reshape(2, 12)
    group = ThreadGroup(3)
    outs = group.run(lambda r, reduce: concat_last(x[:, 4 * r : 4 * r + 4], reduce))
    assert all(torch.equal(o, x) for o in outs)
