"""Op micro-probes (detsample/probe/ops.py).

Pins, on this CPU (torch 2.13, x86 with AVX2/AVX512): ``mm`` and ``F.linear`` round row 0
differently in a batch than alone (the probe must see it), ``log_softmax`` does not (the
sampler relies on it, docs/guarantees.md); a probe that reports everything invariant (a
comparison that never fails) or everything variant; the ``mode`` hook not applied (a
row-wise matmul mode must make the matmul family pass); the JSON keys drifting from the
documented contract.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from detsample.probe.ops import OP_NAMES, invariant_aten_ops, probe_ops, sdpa_backends
from detsample.probe.threads import torch_threads

SMALL = dict(sizes=(1, 2, 3, 4, 8), query_lengths=(1, 2, 3, 33))
JSON_KEYS = {"op", "dtype", "batch_invariant", "run_to_run", "threads", "first_differing_sizes", "max_ulp"}


@pytest.fixture(scope="module")
def float32_results():
    return {
        r.op: r
        for r in probe_ops(
            "cpu", ["float32"], (1, 2), ops=["mm", "linear", "log_softmax", "softmax", "argmax"], **SMALL
        )
    }


PINNED = [("mm", False), ("linear", False), ("log_softmax", True)]


@pytest.mark.parametrize("op,invariant", PINNED)
def test_pinned_ops_on_this_cpu(float32_results, op, invariant):
    r = float32_results[op]
    assert r.batch_invariant is invariant and r.run_to_run and r.threads is True
    if invariant:
        assert r.first_differing_sizes is None and r.max_ulp == 0 and r.ok
    else:
        n = r.first_differing_sizes
        assert n is not None and n[0] == 1 and n[1] in SMALL["sizes"] and r.max_ulp >= 1
        assert not r.ok


def test_json_keys_and_aten_ops(float32_results):
    for r in float32_results.values():
        assert set(r.to_json()) == JSON_KEYS and r.to_json()["dtype"] == "float32"
    assert "aten::mm" in float32_results["mm"].aten_ops
    assert "aten::_log_softmax" in float32_results["log_softmax"].aten_ops
    good = invariant_aten_ops(list(float32_results.values()))
    assert "aten::_log_softmax" in good and "aten::mm" not in good


class RowWiseMatmul(TorchDispatchMode):
    """Every mm/addmm row computed as its own 1-row product at 1 thread: batch- and
    thread-invariant by construction (a stand-in for a batch-invariant mode)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch_threads(1):
            if func is torch.ops.aten.mm.default:
                a, b = args
                return torch.cat([torch.mm(a[i : i + 1], b) for i in range(a.shape[0])])
            if func is torch.ops.aten.addmm.default:
                c, a, b = args[:3]
                return torch.cat([torch.addmm(c, a[i : i + 1], b, **kwargs) for i in range(a.shape[0])])
        return func(*args, **kwargs)


def test_mode_is_entered_around_every_probe():
    results = probe_ops(
        "cpu", ["float32"], (1, 2), ops=["mm", "addmm", "matmul", "linear"], mode=RowWiseMatmul, **SMALL
    )
    assert [r.op for r in results] == ["mm", "addmm", "matmul", "linear"]
    assert all(r.ok and r.first_differing_sizes is None for r in results), results


def test_dtypes_and_attention_backends():
    results = probe_ops(
        "cpu", ["bfloat16", torch.float16], None, ops=["log_softmax", "scaled_dot_product_attention/decode"], **SMALL
    )
    labels = [label for label, _ in sdpa_backends("cpu")]
    assert "" in labels and "math" in labels
    assert len(results) == 2 * (1 + len(labels))
    assert {r.dtype for r in results} == {"bfloat16", "float16"}
    assert all(r.threads is None for r in results)  # one count given: not measured
    assert any(r.op == "scaled_dot_product_attention[math]/decode" for r in results)


BAD = [
    (dict(dtypes=["float8"]), "dtype must be one of float32, bfloat16, float16, got 'float8'"),
    (dict(ops=["conv2d"]), "unknown op 'conv2d'"),
    (dict(threads=[0]), r"threads must be >= 1, got \[0\]"),
    (dict(sizes=[0, 2]), r"sizes must be non-empty and >= 1, got \[0, 2\]"),
    (dict(device="meta"), "device must be 'cpu' or 'cuda', got 'meta'"),
]


@pytest.mark.parametrize("kwargs,message", BAD)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        probe_ops(**{"ops": ["mm"], **kwargs})


def test_op_names_cover_the_issue_list():
    for op in (
        "mm",
        "addmm",
        "matmul",
        "linear",
        "bmm",
        "sum",
        "mean",
        "softmax",
        "log_softmax",
        "layer_norm",
        "rms_norm",
        "scaled_dot_product_attention",
        "embedding",
        "cumsum",
        "topk",
        "sort",
        "argmax",
    ):
        assert op in OP_NAMES
