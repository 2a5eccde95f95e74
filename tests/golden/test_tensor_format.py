"""Tests of detsample/golden/tensor_format.py: tensors <-> golden files, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample.golden import tensor_format as tf
from detsample.golden.format import MANIFEST, GoldenFormatError

DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def sample(dtype: torch.dtype, shape=(3, 4)) -> torch.Tensor:
    x = torch.linspace(-3, 3, int(np.prod(shape))).reshape(shape)
    return (x > 0) if dtype == torch.bool else (x * 10).to(dtype)


def roundtrip(tensors, text_max=tf.TEXT_MAX_ELEMENTS):
    files = tf.encode("g", tf.from_mapping(tensors), {"platform": "p"}, text_max)
    back, manifest, problems = tf.decode(files)
    return files, back, manifest, problems


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("text_max", [1024, 0], ids=["text", "binary"])
def test_roundtrip_bits_dtype_shape(dtype, text_max):
    """Bug pinned: a dtype (bfloat16, bool) or a layout losing bits on the way to disk."""
    x = sample(dtype)
    files, back, manifest, problems = roundtrip({"x": x}, text_max)
    assert problems == []
    ref = tf.from_array("x", x)
    assert back["x"].dtype == ref.dtype and back["x"].shape == (3, 4)
    assert back["x"].bits.tobytes() == ref.bits.tobytes()
    spec = manifest["tensors"]["x"]
    assert spec["dtype"] == str(dtype).removeprefix("torch.")
    assert spec["encoding"] == ("hex-text" if text_max else "raw-le")
    assert (spec["file"] in files) and set(files) == {MANIFEST, spec["file"]}


def test_text_form_is_reviewable():
    files, *_ = roundtrip({"y": torch.tensor([[1.0, -0.0]], dtype=torch.float32)})
    assert files["y.txt"].decode() == ("# y float32 [1,2]\n[0,0] 0x3f800000 1.0\n[0,1] 0x80000000 -0.0\n")


def test_numpy_torch_and_layouts_agree():
    """A transposed view, a big-endian numpy array and the torch tensor store the same bits."""
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = tf.from_array("a", x.t())
    n = tf.from_array("a", np.ascontiguousarray(x.t().numpy()).astype(">f4"))
    assert t.shape == n.shape == (4, 3) and t.bits.tobytes() == n.bits.tobytes()


def test_nan_payload_and_sign_survive():
    bits = np.array([0x7FC00001, 0xFFC00000, 0x80000000], np.uint32)
    _, back, _, _ = roundtrip({"n": bits.view(np.float32)})
    assert back["n"].bits.tolist() == bits.tolist()


def test_encoding_is_deterministic():
    """Bug pinned: dict order or timestamps making every regeneration a diff."""
    a = {"b": sample(torch.float32), "a": sample(torch.int8)}
    b = {"a": sample(torch.int8), "b": sample(torch.float32)}
    assert roundtrip(a)[0] == roundtrip(b)[0]


BAD_INPUTS = [
    ({"x": [1.0, 2.0]}, "must be a torch.Tensor or numpy.ndarray, got list"),
    ({"x": torch.zeros(2, dtype=torch.complex64)}, "dtype torch.complex64"),
    ({"x": np.zeros(2, dtype=np.complex128)}, "dtype complex128"),
    ({"a/b": torch.zeros(2)}, "tensor name must match"),
    ({}, "at least one tensor"),
    ({"X": torch.zeros(1), "x": torch.zeros(1)}, "differ in more than case"),
]


@pytest.mark.parametrize("tensors,msg", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_inputs_named(tensors, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        tf.from_mapping(tensors)


def test_hand_edit_is_reported_not_trusted():
    files, *_ = roundtrip({"y": torch.tensor([1.0, 2.0])})
    edited = dict(files, **{"y.txt": files["y.txt"].replace(b"0x40000000 2.0", b"0x40000001 2.0")})
    back, _, problems = tf.decode(edited)
    assert any("decimal '2.0' disagrees" in p for p in problems)
    assert any("sha256" in p for p in problems)
    assert back["y"].bits.tolist()[1] == 0x40000001  # still comparable


STRUCTURAL = [
    (lambda f: {**f, "y.txt": f["y.txt"].rsplit(b"\n", 2)[0] + b"\n"}, "1 elements, but shape"),
    (lambda f: {k: v for k, v in f.items() if k != "y.txt"}, "y.txt: missing"),
    (lambda f: {**f, MANIFEST: b"{"}, "invalid JSON"),
    (lambda f: {**f, "y.txt": f["y.txt"].replace(b"[1]", b"[7]")}, "expected '\\[1\\]"),
]


@pytest.mark.parametrize("edit,msg", STRUCTURAL, ids=["truncated", "missing", "json", "index"])
def test_structural_damage_raises(edit, msg):
    files, *_ = roundtrip({"y": torch.tensor([1.0, 2.0])})
    with pytest.raises(GoldenFormatError, match=msg):
        tf.decode(edit(files))


@given(st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=40), st.booleans())
def test_any_float32_bits_roundtrip(raw, binary):
    """Property: every float32 pattern (NaNs, subnormals, -0.0) survives both encodings."""
    bits = np.array(raw, dtype=np.uint32)
    _, back, _, problems = roundtrip({"v": bits.view(np.float32)}, 0 if binary else 1024)
    assert problems == [] and back["v"].bits.tolist() == bits.tolist()
