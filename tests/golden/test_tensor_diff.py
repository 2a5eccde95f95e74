"""Tests of detsample/golden/tensor_diff.py: what moved in a tensor golden, and how far."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as hst

from detsample.golden import bits as B
from detsample.golden import tensor_format as tf
from detsample.golden.tensor_diff import compare


def st(x) -> dict:
    return tf.from_mapping(x)


def f32(bits) -> np.ndarray:
    return np.array(bits, dtype=np.uint32).view(np.float32)


def test_equal_is_ok():
    d = compare("g", st({"a": f32([1, 2])}), st({"a": f32([1, 2])}))
    assert d.ok and "unchanged (1 tensors, 2 elements, all bits equal)" in d.summary()


def test_one_ulp_report():
    g = torch.arange(12, dtype=torch.float32).reshape(3, 4) + 1
    o = g.clone()
    o[1, 2] = torch.nextafter(o[1, 2], torch.tensor(np.inf))
    d = compare("k", st({"out": g}), st({"out": o}))
    t = d.tensors[0]
    assert (t.moved, t.first.index, t.first.distance, t.histogram) == (1, (1, 2), 1, {"1": 1})
    rep = d.report()
    assert "out: float32 [3, 4]: 1 of 12 elements moved" in rep
    assert "first moved element: [1,2]: 0x40e00000 (7.0) -> 0x40e00001 (7.0000005), 1 ulp" in rep
    assert "ULP histogram (float32 ULPs): 1: 1" in rep


SPECIAL_CASES = [  # (golden bits, obtained bits, attribute that counts it)
    ([0x7FC00000], [0x7FC00001], "nan_payload"),
    ([0x7FC00000], [0xFFC00000], "nan_payload"),  # sign of a NaN
    ([0x3F800000], [0x7FC00000], "nan_changed"),
    ([0x00000000], [0x80000000], "zero_sign"),
]


@pytest.mark.parametrize("g,o,attr", SPECIAL_CASES)
def test_changes_a_float_compare_misses(g, o, attr):
    """Bug pinned: comparing with == (NaN != NaN, -0.0 == 0.0) hides or invents moves."""
    d = compare("k", st({"t": f32(g)}), st({"t": f32(o)}))
    t = d.tensors[0]
    assert not d.ok and t.moved == 1 and getattr(t, attr) == 1
    others = {"nan_payload", "nan_changed", "zero_sign"} - {attr}
    assert all(getattr(t, a) == 0 for a in others)


def test_dtype_aware_units():
    """bfloat16 distances count bfloat16 steps (not float32 ones); ints count units."""
    g = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    o = g.view(torch.int16).add(torch.tensor([1, 3], dtype=torch.int16)).view(torch.bfloat16)
    t = compare("k", st({"b": g}), st({"b": o})).tensors[0]
    assert t.histogram == {"1": 1, "3-4": 1} and "bfloat16 ULPs" in "\n".join(t.lines())
    t = compare("k", st({"i": np.array([5, -3], np.int64)}), st({"i": np.array([5, 4], np.int64)})).tensors[0]
    assert t.first.distance == 7 and "difference histogram (int64 units): 5-8: 1" in "\n".join(t.lines())


def test_worst_orders_nan_then_distance():
    g = f32([0x3F800000] * 5)
    o = f32([0x3F800001, 0x3F800000, 0x3F800100, 0x7FC00000, 0x3F800010])
    t = compare("k", st({"t": g}), st({"t": o}), worst=3).tensors[0]
    assert [m.index for m in t.worst] == [(3,), (2,), (4,)]


STRUCTURE_CASES = [
    ({"a": f32([1])}, {"a": f32([1]), "b": f32([2])}, "b", "new tensor float32 [1], not in the golden"),
    ({"a": f32([1]), "b": f32([2])}, {"a": f32([1])}, "b", "only in the golden (not in the obtained tensors)"),
    ({"a": f32([1])}, {"a": np.array([1], np.float64)}, "a", "dtype float32 -> float64"),
    ({"a": f32([1, 2])}, {"a": f32([[1, 2]])}, "a", "shape [2] -> [1, 2]"),
]


@pytest.mark.parametrize("g,o,name,problem", STRUCTURE_CASES, ids=[c[3] for c in STRUCTURE_CASES])
def test_structure_changes(g, o, name, problem):
    d = compare("k", st(g), st(o))
    bad = {t.tensor: t.problem for t in d.moved}
    assert bad == {name: problem} and problem in d.report()


@given(
    hst.lists(hst.tuples(hst.integers(0, 2**16 - 1), hst.integers(0, 2**16 - 1)), min_size=1, max_size=60),
    hst.sampled_from(["float16", "bfloat16", "int16", "uint16"]),
)
def test_counts_are_consistent(pairs, dtype):
    """Property: every element whose bits differ is counted once, in the histogram and
    (for floats) in at most one of the NaN / sign-of-zero tallies."""
    g = np.array([a for a, _ in pairs], dtype=np.uint16)
    o = np.array([b for _, b in pairs], dtype=np.uint16)
    dt = B.dtype(dtype)
    mk = lambda bits: {"t": tf.StoredTensor(dt, bits.shape, bits.astype(dt.storage))}  # noqa: E731
    t = compare("k", mk(g), mk(o)).tensors[0]
    assert t.moved == int((g != o).sum()) and t.ok == (t.moved == 0)
    assert sum(t.histogram.values()) == t.moved
    assert t.nan_payload + t.nan_changed == t.histogram.get("NaN", 0)
    assert t.zero_sign == t.histogram.get("0 (sign of zero)", 0)
