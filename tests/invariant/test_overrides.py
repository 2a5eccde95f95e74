"""The override table: every entry names a real aten overload; a CUDA kernel per op plugs
in beside the CPU one.

Pins: a misspelt op name (``torch.library`` would register a kernel nobody calls), a CPU
kernel whose parameters drift from the aten schema, and a CUDA table that replaces the CPU
kernels instead of joining them.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from detsample.invariant import OVERRIDES, Override, kernels_by_key
from detsample.invariant.backends import cuda_attention, cuda_kernels


def _schema(op: str) -> torch._C.FunctionSchema:
    name, _, overload = op.partition(".")
    return getattr(getattr(torch.ops.aten, name), overload or "default")._schema


@pytest.mark.parametrize("o", OVERRIDES, ids=[o.op for o in OVERRIDES])
def test_each_kernel_takes_its_aten_ops_arguments(o):
    schema = _schema(o.op)
    params = inspect.signature(o.cpu).parameters
    if any(p.kind == p.VAR_POSITIONAL for p in params.values()):
        return  # a generic pointwise kernel (self, *args, **kwargs)
    assert [a.name for a in schema.arguments] == list(params), o.op
    assert o.aten_name == f"aten::{o.op}"


def test_families_are_checked():
    with pytest.raises(ValueError, match="family must be one of"):
        Override("mm", "blas", lambda a, b: a)


def test_cuda_kernels_join_the_cpu_ones_under_their_own_key():
    from detsample.kernels.invariant_ops import CUDA_IMPLS

    for op in CUDA_IMPLS:
        _schema(op)  # a real aten overload
    table = kernels_by_key(CUDA_IMPLS)
    for op, fn in CUDA_IMPLS.items():
        assert table[op]["CUDA"] is fn
    assert all(table[o.op]["CPU"] is o.cpu for o in OVERRIDES)
    with pytest.raises(TypeError, match="must be callable"):
        kernels_by_key({"mm": 3})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")
def test_without_cuda_only_the_cpu_key_is_registered():
    assert cuda_kernels() == {} and cuda_attention() is None
    assert all(set(by_key) == {"CPU"} for by_key in kernels_by_key().values())
