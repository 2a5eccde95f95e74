"""Coverage check: which ops a forward runs that the batch-invariant mode leaves to torch.

``with OpRecorder() as rec: model(...)`` collects the aten ops the block dispatches
(``rec.ops``: ``"aten::mm"``, ``"aten::mean.dim"``, ...). :func:`uncovered` returns those
that are neither overridden by the mode (:data:`~detsample.invariant.table.OVERRIDES`),
nor exact by construction (:data:`EXACT_OPS`, views), nor in a measured-invariant table the
caller passes (``detsample.probe.ops.invariant_aten_ops`` gives one, as ``"aten::op"``
names). An empty list means every op of that forward is accounted for.

Ops the invariant attention (:func:`detsample.invariant.attention.attend`) runs inside
itself are not recorded: that function is one unit, tested as such.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable

from torch.utils._python_dispatch import TorchDispatchMode

from detsample.invariant.attention import attend
from detsample.invariant.table import OVERRIDES

#: ops that do no floating-point arithmetic (creation, copies, indexing, comparisons,
#: integer and boolean ops) or whose every output element is ONE correctly rounded IEEE
#: operation on the matching input elements (add/mul with alpha 1, neg, division, a dtype
#: cast): the same bits on torch's vector and scalar loops, so no batch, shape or thread
#: count can change them. tests/invariant/test_coverage.py measures the arithmetic ones.
EXACT_OPS = frozenset({
    "aten::_to_copy", "aten::_unsafe_view", "aten::arange", "aten::arange.start", "aten::arange.start_step",
    "aten::bitwise_and.Tensor", "aten::bitwise_or.Tensor", "aten::bitwise_not",
    "aten::cat", "aten::clone", "aten::copy_", "aten::embedding", "aten::empty.memory_format",
    "aten::empty_like", "aten::eq.Scalar", "aten::eq.Tensor", "aten::fill_.Scalar",
    "aten::fill_.Tensor", "aten::full", "aten::ge.Scalar", "aten::ge.Tensor",
    "aten::gt.Scalar", "aten::gt.Tensor", "aten::index.Tensor", "aten::index_select",
    "aten::le.Scalar", "aten::le.Tensor", "aten::lift_fresh", "aten::lt.Scalar",
    "aten::lt.Tensor", "aten::masked_fill.Scalar", "aten::ne.Scalar", "aten::ne.Tensor",
    "aten::new_empty", "aten::new_ones", "aten::new_zeros", "aten::ones", "aten::ones_like",
    "aten::scalar_tensor", "aten::where.self", "aten::zeros", "aten::zeros_like",
    "aten::add.Tensor", "aten::add_.Tensor", "aten::add.Scalar", "aten::add_.Scalar",
    "aten::sub.Tensor", "aten::sub.Scalar", "aten::mul.Tensor", "aten::mul_.Tensor",
    "aten::mul.Scalar", "aten::div.Tensor", "aten::div.Scalar", "aten::neg",
    "aten::reciprocal", "aten::sqrt", "aten::maximum", "aten::minimum",
})


def op_name(func: Any) -> str:
    """``"aten::mm"`` for a default overload, ``"aten::mean.dim"`` otherwise."""
    name = func._schema.name
    overload = func._overloadname
    return name if overload in ("default", "") else f"{name}.{overload}"


def _inside_attention() -> bool:
    frame = sys._getframe(2)
    code = attend.__code__
    while frame is not None:
        if frame.f_code is code:
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
        if not _inside_attention():
            (self.views if func.is_view else self.ops).add(op_name(func))
        return func(*args, **(kwargs or {}))


def _base(name: str) -> str:
    return name.split(".", 1)[0]


def uncovered(ops: Iterable[str], measured: Iterable[str] = ()) -> list[str]:
    """The ops of ``ops`` that are neither overridden, nor exact, nor in ``measured``
    (names with or without the overload: ``"aten::add"`` covers ``"aten::add.Tensor"``)."""
    covered = {o.aten_name for o in OVERRIDES} | EXACT_OPS
    measured = set(measured)
    return sorted(op for op in set(ops)
                  if op not in covered and op not in measured and _base(op) not in measured)
