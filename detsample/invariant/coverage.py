"""Coverage check: which ops a forward runs that the batch-invariant mode leaves to torch.

``with OpRecorder() as rec: model(...)`` collects the aten ops the block dispatches
(``rec.ops``: ``"aten::mm"``, ``"aten::mean.dim"``, ...). :func:`uncovered` returns those
that are neither overridden by the mode (:data:`~detsample.invariant.overrides.OVERRIDES`),
nor exact by construction (:data:`EXACT_OPS`, views), nor in a measured-invariant table the
caller passes (``detsample.probe.ops.invariant_aten_ops`` gives one, as ``"aten::op"``
names). An empty list means every op of that forward is accounted for.

Ops the invariant attention (:func:`detsample.invariant.attention.attend`) and the
tensor-parallel units (:data:`detsample.invariant.sharded.UNITS`: the split-K portable
product, the exact embedding and concatenation collectives) run inside themselves are
not recorded: each of those functions is one unit, tested as such.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from detsample.invariant.attention import attend
from detsample.invariant.overrides import OVERRIDES
from detsample.invariant.sharded import UNITS

#: ops that do no floating-point arithmetic (creation, copies, indexing, comparisons,
#: integer and boolean ops) or whose every output element is ONE correctly rounded IEEE
#: operation on the matching input elements (add/mul with alpha 1, neg, division, a dtype
#: cast): the same bits on torch's vector and scalar loops and on every CPU, so no batch,
#: shape, thread count or ISA can change them. tests/invariant/test_coverage.py measures
#: the arithmetic ones against numpy's IEEE operations. (Not ``sqrt``: torch's CPU kernel
#: is MKL's vector math, 1 ulp off for ~15% of float32 inputs; the mode overrides it.)
EXACT_OPS = frozenset(
    {
        "aten::_to_copy",
        "aten::_unsafe_view",
        "aten::arange",
        "aten::arange.start",
        "aten::arange.start_step",
        "aten::bitwise_and.Tensor",
        "aten::bitwise_or.Tensor",
        "aten::bitwise_not",
        "aten::cat",
        "aten::clone",
        "aten::copy_",
        "aten::embedding",
        "aten::empty.memory_format",
        "aten::empty_like",
        "aten::eq.Scalar",
        "aten::eq.Tensor",
        "aten::fill_.Scalar",
        "aten::fill_.Tensor",
        "aten::full",
        "aten::ge.Scalar",
        "aten::ge.Tensor",
        "aten::gt.Scalar",
        "aten::gt.Tensor",
        "aten::index.Tensor",
        "aten::index_select",
        "aten::le.Scalar",
        "aten::le.Tensor",
        "aten::lift_fresh",
        "aten::lt.Scalar",
        "aten::lt.Tensor",
        "aten::masked_fill.Scalar",
        "aten::ne.Scalar",
        "aten::ne.Tensor",
        "aten::new_empty",
        "aten::new_ones",
        "aten::new_zeros",
        "aten::ones",
        "aten::ones_like",
        "aten::scalar_tensor",
        "aten::where.self",
        "aten::zeros",
        "aten::zeros_like",
        "aten::add.Tensor",
        "aten::add_.Tensor",
        "aten::add.Scalar",
        "aten::add_.Scalar",
        "aten::sub.Tensor",
        "aten::sub.Scalar",
        "aten::mul.Tensor",
        "aten::mul_.Tensor",
        "aten::mul.Scalar",
        "aten::div.Tensor",
        "aten::div.Scalar",
        "aten::neg",
        "aten::reciprocal",
        "aten::maximum",
        "aten::minimum",
        # orderings, counts, selections and elementwise exact ops (MoE routing, masks)
        "aten::sort",
        "aten::sort.stable",
        "aten::argsort",
        "aten::argsort.stable",
        "aten::histc",
        "aten::one_hot",
        "aten::nonzero",
        "aten::repeat_interleave.self_int",
        "aten::repeat_interleave.self_Tensor",
        "aten::repeat_interleave.Tensor",
        "aten::gather",
        "aten::scatter.src",
        "aten::scatter.value",
        "aten::scatter_.src",
        "aten::scatter_.value",
        "aten::masked_fill_.Scalar",
        "aten::masked_fill.Tensor",
        "aten::masked_fill_.Tensor",
        "aten::flip",
        "aten::roll",
        "aten::triu",
        "aten::tril",
        "aten::clamp",
        "aten::clamp_",
        "aten::clamp_min",
        "aten::clamp_max",
        "aten::abs",
        "aten::sign",
        "aten::floor",
        "aten::ceil",
        "aten::round",
        "aten::trunc",
        "aten::relu",
        "aten::logical_and",
        "aten::logical_or",
        "aten::logical_not",
        "aten::any",
        "aten::any.dim",
        "aten::all",
        "aten::all.dim",
        "aten::isinf",
        "aten::isnan",
        "aten::isfinite",
        "aten::max",
        "aten::max.dim",
        "aten::min",
        "aten::min.dim",
        "aten::amax",
        "aten::amin",
        "aten::argmax",
        "aten::argmin",
        "aten::stack",
        "aten::expand",
        "aten::index_copy",
        "aten::index_copy_",
        "aten::div.Tensor_mode",
        "aten::div.Scalar_mode",
        "aten::mul_.Scalar",
        "aten::div_.Tensor",
        "aten::div_.Scalar",
        "aten::sub_.Tensor",
        "aten::neg_",
        "aten::square",
        "aten::where.ScalarOther",
        "aten::where.ScalarSelf",
        "aten::where.Scalar",
        "aten::logical_xor",
        "aten::bitwise_xor.Tensor",
        "aten::rsub.Scalar",
        "aten::rsub.Tensor",
        "aten::detach",
        "aten::alias",
        "aten::_local_scalar_dense",
        "aten::item",
        "aten::equal",
        "aten::sym_size.int",
        "aten::empty_strided",
        "aten::full_like",
        "aten::new_full",
        "aten::masked_scatter",
        "aten::masked_select",
        "aten::searchsorted.Tensor",
        "aten::bucketize.Tensor",
        "aten::view_as_real",
        "aten::view_as_complex",
        "aten::bitwise_and.Scalar",
        "aten::bitwise_or.Scalar",
        "aten::__and__.Tensor",
        "aten::__or__.Tensor",
        # a copy with a constant border (a convolution window shorter than its kernel, padded)
        "aten::constant_pad_nd",
    }
)


def _integral(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not (t.dtype.is_floating_point or t.dtype.is_complex)


def _unique(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.numel() == int(torch.unique(index).numel())


#: ops exact only for some arguments: name -> predicate(args, kwargs). Integer prefix sums
#: and divisions are exact; an indexed write or accumulation is exact when it adds nothing
#: (accumulate=False) or each destination is written once per call.
CONDITIONAL: dict[str, Any] = {
    "aten::cumsum": lambda a, k: _integral(a[0]) or (k.get("dtype") is not None and not k["dtype"].is_floating_point),
    "aten::cumsum_": lambda a, k: _integral(a[0]),
    "aten::floor_divide": lambda a, k: _integral(a[0]),
    "aten::floor_divide.Scalar": lambda a, k: _integral(a[0]),
    "aten::remainder.Scalar": lambda a, k: _integral(a[0]),
    "aten::remainder.Tensor": lambda a, k: _integral(a[0]),
    "aten::index_put_": lambda a, k: not (a[3] if len(a) > 3 else k.get("accumulate", False)) or _integral(a[0]),
    "aten::index_put": lambda a, k: not (a[3] if len(a) > 3 else k.get("accumulate", False)) or _integral(a[0]),
    "aten::_index_put_impl_": lambda a, k: not (a[3] if len(a) > 3 else k.get("accumulate", False)) or _integral(a[0]),
    "aten::index_add_": lambda a, k: _integral(a[0]) or _unique(a[2]),
    "aten::index_add": lambda a, k: _integral(a[0]) or _unique(a[2]),
    "aten::scatter_add_": lambda a, k: _integral(a[0]) or _unique(a[2]),
    "aten::scatter_add": lambda a, k: _integral(a[0]) or _unique(a[2]),
}


def op_name(func: Any) -> str:
    """``"aten::mm"`` for a default overload, ``"aten::mean.dim"`` otherwise."""
    name = func._schema.name
    overload = func._overloadname
    return name if overload in ("default", "") else f"{name}.{overload}"


_UNIT_CODES = frozenset(f.__code__ for f in (attend, *UNITS))


def _inside_unit() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code in _UNIT_CODES:
            return True
        frame = frame.f_back
    return False


class OpRecorder(TorchDispatchMode):
    """Records :func:`op_name` of every aten op dispatched under it (views apart:
    ``views``), except inside the invariant attention."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.views: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if not _inside_unit():
            name = op_name(func)
            if name in CONDITIONAL and CONDITIONAL[name](args, kwargs or {}):
                return func(*args, **(kwargs or {}))  # exact for these arguments
            (self.views if func.is_view else self.ops).add(name)
            if not func.is_view:
                self.record(name, args)
        return func(*args, **(kwargs or {}))

    def record(self, name: str, args: tuple) -> None:
        """Hook for subclasses: called with every recorded (non-view) op."""


def _base(name: str) -> str:
    return name.split(".", 1)[0]


def uncovered(ops: Iterable[str], measured: Iterable[str] = ()) -> list[str]:
    """The ops of ``ops`` that are neither overridden, nor exact, nor in ``measured``
    (names with or without the overload: ``"aten::add"`` covers ``"aten::add.Tensor"``)."""
    covered = {o.aten_name for o in OVERRIDES} | EXACT_OPS
    measured = set(measured)
    return sorted(op for op in set(ops) if op not in covered and op not in measured and _base(op) not in measured)
