"""The portable product: exact integer sums of fixed-point operands, bit for bit the oracle.

Pins: a sum that rounds (a chunk too long for float64, an int64 accumulation dropped), a
scale taken over the wrong axis (a row's bits would then follow its neighbours), a route
(one product vs K chunks) that changes S, a K split (tensor-parallel ranks) whose partial
sums do not add up to the unsplit product, non-finite values leaking into other rows, a
key-scaled value product whose scale couples keys (a zero-weight key would then move the
attention's output), and a precision below the stated bound.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.invariant import fixedpoint as fp
from oracles import invariant as oracle


def _rand(shape, seed: int, family: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if family == "spread":      # exponents spread over 2**-40 .. 2**40 within a row
        x = x * torch.exp2(torch.randint(-40, 41, shape, generator=g).float())
    elif family == "huge":
        x = x * 1e30
    elif family == "tiny":
        x = x * 1e-30
    elif family == "ties":      # few distinct values: exact ties and cancellations
        x = torch.randint(-3, 4, shape, generator=g).float() * 0.5
    elif family == "sparse":
        x = x * (torch.rand(shape, generator=g) < 0.2)
    elif family == "max":       # every element just below its row's power of two, one sign:
        x = 1.0 - torch.rand(shape, generator=g) * 2.0 ** -12   # the largest possible sums
    return x


FAMILIES = ["normal", "spread", "huge", "tiny", "ties", "sparse"]


def _bits_equal(x: torch.Tensor, y: np.ndarray) -> bool:
    return np.array_equal(x.numpy().view(np.int32), np.asarray(y, np.float32).view(np.int32))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 5), k=st.integers(1, 600), n=st.integers(1, 5),
       fa=st.sampled_from(FAMILIES), fb=st.sampled_from(FAMILIES), seed=st.integers(0, 2**16))
def test_matmul_is_the_oracle_bit_for_bit(m, k, n, fa, fb, seed):
    a, b = _rand((m, k), seed, fa), _rand((k, n), seed + 1, fb)
    assert _bits_equal(fp.matmul(a, b), oracle.matmul(a.numpy(), b.numpy()))


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 4), k=st.integers(1, 300), n=st.integers(1, 4),
       fp_=st.sampled_from(FAMILIES), fv=st.sampled_from(FAMILIES), seed=st.integers(0, 2**16))
def test_weighted_sum_is_the_oracle_bit_for_bit(m, k, n, fp_, fv, seed):
    p, v = _rand((m, k), seed, fp_).abs(), _rand((k, n), seed + 1, fv)
    assert _bits_equal(fp.weighted_sum(p, v), oracle.weighted_sum(p.numpy(), v.numpy()))


@pytest.mark.parametrize("family", ["normal", "max"])
@pytest.mark.parametrize("k", [1, 255, 256, 257, 1000, 3000])
def test_both_routes_give_the_same_exact_sums(k, family, monkeypatch):
    """One float64 product when the Cauchy-Schwarz bound allows it, K chunks in int64
    otherwise: the same integers S either way, and the exact ones (also for the largest
    sums the bit widths allow, where a chunk one bit too long would round)."""
    a, b = _rand((7, k), k, family), _rand((k, 9), k + 1, "spread" if family == "normal" else family)
    fa, fb = fp.to_fixed(a, -1, fp.A_BITS), fp.fixed_b(b)
    one = fp.exact_dot(fa, fb)
    monkeypatch.setattr(fp, "_EXACT_BOUND", -1.0)          # force the chunked route
    chunked = fp.exact_dot(fa, fb)
    assert torch.equal(one.to(torch.int64), chunked.to(torch.int64))
    exact = [[sum(int(x) * int(y) for x, y in zip(fa.ints[i].tolist(), fb.ints[:, j].tolist()))
              for j in range(9)] for i in range(7)]
    assert chunked.tolist() == exact
    if family == "max" and k > fp.K_CHUNK:
        assert max(abs(x) for row in exact for x in row) > 2 ** 53   # float64 alone would round


def test_a_k_split_adds_up_exactly():
    """What a row-parallel layer does across ranks: the int64 sums of the K shards, with
    the row and column scales of the whole operands, are the unsplit product."""
    a, b = _rand((5, 1000), 3, "spread"), _rand((1000, 6), 4, "normal")
    fa, fb = fp.to_fixed(a, -1, fp.A_BITS), fp.fixed_b(b)
    whole = fp.combine(fp.exact_dot(fa, fb), fa, fb, torch.float32)
    parts = torch.zeros(5, 6, dtype=torch.int64)
    for lo, hi in ((0, 123), (123, 500), (500, 1000)):
        sa = fp.Fixed(fa.ints[:, lo:hi], fa.exps, None, -1)
        sb = fp.Fixed(fb.ints[lo:hi], fb.exps, None, -2)
        parts += fp.exact_dot(sa, sb).to(torch.int64)
    assert torch.equal(fp.combine(parts, fa, fb, torch.float32), whole)
    assert torch.equal(whole, fp.matmul(a, b))


def test_a_row_depends_on_itself_only():
    a, b = _rand((12, 300), 5, "spread"), _rand((300, 40), 6, "normal")
    full = fp.matmul(a, b)
    for i in range(12):
        assert torch.equal(fp.matmul(a[i: i + 1], b), full[i: i + 1])
    batched = fp.matmul(torch.stack([a, a.flip(0)]), torch.stack([b, b]))
    assert torch.equal(batched[0], full) and torch.equal(batched[1], full.flip(0))


def test_a_zero_weight_key_changes_nothing_in_weighted_sum():
    """The attention relies on it: future and padded keys have weight 0."""
    p, v = _rand((4, 128), 7, "normal").abs(), _rand((128, 65), 8, "spread")
    p[:, 100:] = 0
    other = v.clone()
    other[100:] = _rand((28, 65), 9, "huge")
    assert torch.equal(fp.weighted_sum(p, v), fp.weighted_sum(p, other))
    # the column-scaled product does not have this property (why the attention needs it)
    assert not torch.equal(fp.matmul(p, v), fp.matmul(p, other))


def test_non_finite_values_poison_only_their_row_and_column():
    a, b = _rand((4, 50), 10, "normal"), _rand((50, 5), 11, "normal")
    a[1, 3] = float("nan")
    b[7, 2] = float("inf")
    c = fp.matmul(a, b)
    assert torch.isnan(c[1]).all() and torch.isnan(c[:, 2]).all()
    ok = torch.ones(4, 5, dtype=torch.bool)
    ok[1], ok[:, 2] = False, False
    clean = fp.matmul(torch.where(torch.isfinite(a), a, 0.0), torch.where(torch.isfinite(b), b, 0.0))
    assert torch.equal(c[ok], clean[ok])
    v = _rand((50, 5), 12, "normal")
    v[9, 0] = float("nan")
    p = _rand((3, 50), 13, "normal").abs()
    p[0, 9] = 0.0
    w = fp.weighted_sum(p, v)
    assert not torch.isnan(w[0]).any() and torch.isnan(w[1:]).all()


@pytest.mark.parametrize("family", ["normal", "spread"])
def test_precision_within_the_stated_bound(family):
    """|C - A B| <= 2**(e_m - 22) sum|b| + 2**(f_n - 25) sum|a| + 2**-23 |A B|: the
    rounding of each operand to its fixed point, then the float32 rounding."""
    a, b = _rand((16, 512), 14, family), _rand((512, 16), 15, "normal")
    exact = a.double() @ b.double()
    got = fp.matmul(a, b).double()
    e = torch.frexp(a.abs().amax(1, keepdim=True).double())[1].double()
    f = torch.frexp(b.abs().amax(0, keepdim=True).double())[1].double()
    bound = (torch.exp2(e - 22) * b.abs().double().sum(0, keepdim=True)
             + torch.exp2(f - 25) * a.abs().double().sum(1, keepdim=True)
             + 2.0 ** -23 * exact.abs())
    assert bool(((got - exact).abs() <= bound * 1.001).all())


def test_reduced_precision_inputs_are_exact_in_float32_and_round_once():
    a, b = _rand((3, 70), 16, "normal").bfloat16(), _rand((70, 4), 17, "normal").bfloat16()
    assert torch.equal(fp.matmul(a, b), fp.matmul(a.float(), b.float()).bfloat16())
    assert fp.matmul(a, b).dtype == torch.bfloat16
