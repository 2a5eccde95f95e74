"""Tests of detsample/golden/synthtensors.py (``detsample.testing.tensor``): kernel-test
inputs whose bits depend only on (shape, dtype, seed, family)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample.golden.synthtensors import FAMILIES, tensor_bits
from detsample.testing import tensor

# sha256 (first 16 hex digits) of the bits of tensor((64, 33), dtype, seed=7, family):
# computed once; identical on every machine, numpy version and ISA, or the goldens of
# kernels fed with these inputs would move for reasons that are not the kernel's.
PINNED = [
    ("float64", "random", "08667d88ba2ef896"),
    ("float64", "huge", "4f40bb10fe32d124"),
    ("float64", "nan", "5dea72ca6453fe9b"),
    ("float32", "random", "fa9f28eb02242cca"),
    ("float32", "ties", "1c6b192852403d7c"),
    ("float32", "huge", "c8bcff15ce7c1b43"),
    ("float32", "neginf", "43fb7a7bd18bb5de"),
    ("float32", "nan", "0f8d9ac5fcdc697b"),
    ("float16", "random", "0435dff9059adea4"),
    ("float16", "huge", "225f7dcd8ec6d060"),
    ("float16", "nan", "23d82715097e9603"),
    ("bfloat16", "random", "438dee11b334630c"),
    ("bfloat16", "huge", "f806b94f9ea1b863"),
    ("bfloat16", "nan", "a4dc81c528bc3483"),
    ("int64", "random", "fffe84079677191f"),
    ("int64", "huge", "f6f29ee461a1c6b8"),
    ("int8", "huge", "f425d84864aa6d32"),
    ("uint8", "random", "92fc81e9bdb850ff"),
    ("bool", "random", "a82b862daea9acbf"),
]


@pytest.mark.parametrize("dtype,family,digest", PINNED)
def test_bits_pinned(dtype, family, digest):
    """Bug pinned: inputs drawn through a platform-dependent path (a distribution
    method, a transcendental, a torch kernel) differing between machines."""
    b = tensor_bits((64, 33), dtype, 7, family)
    assert hashlib.sha256(b.tobytes()).hexdigest()[:16] == digest


FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_float_families(dtype):
    n = 20000
    fin = torch.finfo(dtype)
    t = tensor(n, dtype, 3, family="ties").double()
    assert set(t.unique().tolist()) == {0.0, 0.5, 1.0, 1.5}
    h = tensor(n, dtype, 3, family="huge").double()
    assert torch.isfinite(h).all() and h.abs().max() > fin.max / 2
    r = tensor(n, dtype, 3).double()
    assert torch.isfinite(r).all() and 0.9 < float(r.std()) < 1.1
    # ~30% -inf: 5 binomial standard deviations (sd = 65 at n=20000)
    ni = int(torch.isneginf(tensor(n, dtype, 3, family="neginf")).sum())
    assert abs(ni - 0.3 * n) < 5 * 65
    x = tensor(n, dtype, 3, family="nan")
    assert abs(int(x.isnan().sum()) - 0.1 * n) < 5 * 43
    assert int(torch.isposinf(x).sum()) > 0 and int(torch.isneginf(x).sum()) > 0


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nan_is_canonical_quiet_nan(dtype):
    x = tensor(200, dtype, 1, family="nan")
    raw = x.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[x.element_size()])[x.isnan()]
    assert raw.unique().numel() == 1


def test_bfloat16_rounds_like_torch():
    """The integer round-to-nearest-even equals torch's float32 -> bfloat16 cast."""
    for fam in ("random", "ties", "neginf"):  # (huge scales to each dtype's own max)
        f32 = tensor(5000, torch.float32, 11, family=fam)
        b16 = tensor(5000, torch.bfloat16, 11, family=fam)
        assert torch.equal(f32.to(torch.bfloat16).view(torch.int16), b16.view(torch.int16))


INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_int_families(dtype):
    info = torch.iinfo(dtype)
    r = tensor(5000, dtype, 2)
    assert int(r.min()) >= max(info.min, -1000) and int(r.max()) <= min(info.max, 1000)
    assert set(tensor(5000, dtype, 2, family="ties").unique().tolist()) == {0, 1, 2, 3}
    h = tensor(5000, dtype, 2, family="huge").to(torch.float64)
    span = min(1000, 2 ** (info.bits - 2))
    near = (h >= info.max - span + 1) | (h <= info.min + span - 1)
    assert bool(near.all())


def test_returns_requested_shape_dtype_device():
    t = tensor((2, 0, 3), torch.bfloat16, 0)
    assert t.shape == (2, 0, 3) and t.dtype == torch.bfloat16 and t.device.type == "cpu"
    assert tensor((), "float16", 0).shape == ()
    assert tensor(4, "bool", 0).dtype == torch.bool


BAD = [
    (dict(shape=(2,), dtype=torch.float32, seed=0, family="gauss"), "family must be one of"),
    (dict(shape=(2,), dtype=torch.int32, seed=0, family="nan"), "needs a floating dtype"),
    (dict(shape=(2,), dtype=torch.bool, seed=0, family="ties"), "needs a numeric dtype"),
    (dict(shape=(2,), dtype=torch.float32, seed=-1), "seed must be a non-negative integer"),
    (dict(shape=(2, -1), dtype=torch.float32, seed=0), "shape must be non-negative"),
    (dict(shape=(2,), dtype=torch.complex64, seed=0), "dtype must be one of"),
]


@pytest.mark.parametrize("kw,msg", BAD, ids=[m for _, m in BAD])
def test_bad_arguments_named(kw, msg):
    with pytest.raises(ValueError, match=msg):
        tensor(**kw)


@given(
    st.lists(st.integers(0, 5), min_size=0, max_size=3),
    st.integers(0, 2**64),
    st.sampled_from(FAMILIES),
    st.sampled_from(["float32", "bfloat16", "float64"]),
)
def test_same_arguments_same_bits(shape, seed, family, dtype):
    """Property: the bits are a function of the arguments (no hidden state), and a
    different seed gives other bits."""
    a = tensor_bits(shape, dtype, seed, family)
    b = tensor_bits(shape, dtype, seed, family)
    assert a.shape == tuple(shape) and np.array_equal(a, b)
    if a.size >= 8 and family != "ties":
        assert not np.array_equal(a, tensor_bits(shape, dtype, seed + 1, family))
