"""Coverage: every op the tiny models run under the mode is overridden or exact.

Pins: a model op the mode forgot (a new transformers release calling ``aten::bmm`` for
RoPE, say) silently staying on torch's batch-variant kernel, and an op listed as exact
whose vector and scalar loops in fact round differently.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detsample.invariant.coverage import EXACT_OPS, OpRecorder, op_name, uncovered
from detsample.models import load_model
from detsample.probe.threads import torch_threads

MODELS = ["hf-tiny-llama", "hf-tiny-qwen2"]


@pytest.mark.parametrize("name", MODELS)
def test_every_op_of_the_tiny_models_is_covered(name):
    m = load_model(name, batch_invariant=True)
    caches = [m.new_cache(), m.new_cache()]
    with OpRecorder() as rec:
        m.forward(caches, [[1, 2, 3, 4, 5], [6, 7]])  # prefill, padded
        m.forward(caches, [[8], [9, 10]])  # decode and a chunk
    assert "aten::mm" in rec.ops and "aten::mean.dim" in rec.ops
    assert uncovered(rec.ops) == []


def test_an_op_outside_the_table_is_reported():
    x = torch.randn(4, 6)
    with OpRecorder() as rec:
        torch.cumsum(torch.mm(x, x.t()), -1).erf()
        torch.cumsum(torch.arange(5), 0)  # an integer prefix sum is exact
    assert "aten::mm" in rec.ops
    assert uncovered(rec.ops) == ["aten::cumsum", "aten::erf"]


def test_a_measured_table_covers_ops_by_name_with_or_without_overload():
    assert uncovered(["aten::erf", "aten::cumsum", "aten::mm", "aten::topk"]) == ["aten::cumsum", "aten::erf"]
    assert uncovered(["aten::erf", "aten::cumsum"], measured={"aten::erf", "aten::cumsum"}) == []
    assert op_name(torch.ops.aten.mean.dim) == "aten::mean.dim"
    assert op_name(torch.ops.aten.mm.default) == "aten::mm"


# Every arithmetic op of EXACT_OPS, and a call of it: (name, fn(x, y) with x, y float32).
ARITHMETIC = [
    ("aten::add.Tensor", lambda x, y: x + y),
    ("aten::sub.Tensor", lambda x, y: x - y),
    ("aten::mul.Tensor", lambda x, y: x * y),
    ("aten::div.Tensor", lambda x, y: x / y),
    ("aten::add.Scalar", lambda x, y: torch.ops.aten.add.Scalar(x, 0.3)),
    ("aten::mul.Scalar", lambda x, y: torch.ops.aten.mul.Scalar(x, 1.7)),
    ("aten::div.Scalar", lambda x, y: torch.ops.aten.div.Scalar(x, 1.7)),
    ("aten::neg", lambda x, y: -x),
    ("aten::reciprocal", lambda x, y: torch.reciprocal(y)),
    ("aten::maximum", torch.maximum),
    ("aten::minimum", torch.minimum),
    ("aten::_to_copy", lambda x, y: x.to(torch.bfloat16)),
    ("aten::masked_fill.Scalar", lambda x, y: x.masked_fill(y > 0, -1.5)),
    ("aten::where.self", lambda x, y: torch.where(x > y, x, y)),
    ("aten::clamp", lambda x, y: x.clamp(-1.0, 1.0)),
    ("aten::clamp_min", lambda x, y: torch.clamp_min(x, 0.25)),
    ("aten::clamp_max", lambda x, y: torch.clamp_max(x, 0.25)),
    ("aten::abs", lambda x, y: x.abs()),
    ("aten::sign", lambda x, y: x.sign()),
    ("aten::floor", lambda x, y: x.floor()),
    ("aten::ceil", lambda x, y: x.ceil()),
    ("aten::round", lambda x, y: x.round()),
    ("aten::trunc", lambda x, y: x.trunc()),
    ("aten::relu", lambda x, y: x.relu()),
    ("aten::square", lambda x, y: x.square()),
    ("aten::rsub.Scalar", lambda x, y: 1.5 - x),
    ("aten::div.Tensor_mode", lambda x, y: torch.div(x, y, rounding_mode="floor")),
    ("aten::amax", lambda x, y: torch.stack([x, y]).amax(0)),
]


#: the IEEE operation of each one-operation arithmetic op, in numpy: (name, torch call,
#: numpy call) on float32 x, y
IEEE = [
    ("aten::add.Tensor", lambda x, y: x + y, np.add),
    ("aten::sub.Tensor", lambda x, y: x - y, np.subtract),
    ("aten::mul.Tensor", lambda x, y: x * y, np.multiply),
    ("aten::div.Tensor", lambda x, y: x / y, np.divide),
    ("aten::add.Scalar", lambda x, y: torch.ops.aten.add.Scalar(x, 0.3), lambda x, y: x + np.float32(0.3)),
    ("aten::mul.Scalar", lambda x, y: torch.ops.aten.mul.Scalar(x, 1.7), lambda x, y: x * np.float32(1.7)),
    ("aten::div.Scalar", lambda x, y: torch.ops.aten.div.Scalar(x, 1.7), lambda x, y: x / np.float32(1.7)),
    ("aten::reciprocal", lambda x, y: torch.reciprocal(y), lambda x, y: np.float32(1) / y),
    ("aten::square", lambda x, y: x.square(), lambda x, y: x * x),
    ("aten::rsub.Scalar", lambda x, y: 1.5 - x, lambda x, y: np.float32(1.5) - x),
    ("aten::neg", lambda x, y: -x, lambda x, y: -x),
]


@pytest.mark.parametrize("name,fn,ieee", IEEE, ids=[i[0] for i in IEEE])
def test_exact_arithmetic_is_the_ieee_operation(name, fn, ieee):
    """Each arithmetic op of EXACT_OPS gives numpy's IEEE result bit for bit (then every
    CPU does). torch's CPU ``sqrt`` does not (MKL's vector math), so it is not listed:
    the mode overrides it (negative control below)."""
    g = torch.Generator().manual_seed(len(name))
    x, y = torch.randn(100_000, generator=g) * 3, torch.randn(100_000, generator=g) + 0.5
    with np.errstate(all="ignore"):
        want = ieee(x.numpy(), y.numpy()).astype(np.float32)
    assert name in EXACT_OPS
    assert np.array_equal(fn(x, y).numpy().view(np.int32), want.view(np.int32))


def test_torchs_cpu_sqrt_is_not_the_ieee_one_and_is_overridden():
    x = torch.rand(100_000, generator=torch.Generator().manual_seed(1)) * 10
    assert "aten::sqrt" not in EXACT_OPS
    assert not np.array_equal(torch.sqrt(x).numpy(), np.sqrt(x.numpy()))
    assert uncovered(["aten::sqrt"]) == []


def test_the_arithmetic_exact_ops_are_all_measured():
    listed = {name for name, _ in ARITHMETIC}
    assert listed <= EXACT_OPS
    assert {"aten::add.Tensor", "aten::mul.Tensor", "aten::div.Tensor"} <= listed


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name,fn", ARITHMETIC, ids=[a[0] for a in ARITHMETIC])
def test_exact_ops_give_an_element_the_same_bits_on_every_loop(name, fn, threads):
    """Element i alone (scalar loop) vs inside long tensors (vector loop, thread chunks)."""
    g = torch.Generator().manual_seed(len(name))
    x, y = torch.randn(70001, generator=g) * 3, torch.randn(70001, generator=g) + 0.5
    with torch_threads(threads):
        whole = fn(x, y)
        for s, n in [(0, 1), (5, 15), (100, 33), (69990, 11)]:
            assert torch.equal(fn(x[s : s + n], y[s : s + n]), whole[s : s + n]), (s, n)
        rows = fn(x[:69989].view(-1, 23), y[:69989].view(-1, 23))
        assert torch.equal(rows.reshape(-1), whole[:69989])
