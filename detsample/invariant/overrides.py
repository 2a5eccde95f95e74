"""The override table of the batch-invariant mode: aten op -> kernel, per dispatch key.

Each :class:`Override` names one aten op overload as ``torch.library`` spells it (``"mm"``,
``"mean.dim"``), its family, and its CPU kernel (:mod:`detsample.invariant.cpu`; the SDPA
kernels from :mod:`detsample.invariant.attention`, the depthwise convolution from
:mod:`detsample.invariant.conv`).
:func:`kernels_by_key` turns the table into ``{op: {dispatch key: kernel}}``, the shape the
mode registers; another backend plugs in as one more key per op: the CUDA kernels come
from ``detsample.kernels.invariant_ops.CUDA_IMPLS`` (same op names, aten signatures) when
that module and a CUDA device exist (:mod:`detsample.invariant.backends`), and the
attention uses its ``ATTENTION``. A kernel takes the aten op's arguments and
returns what the op returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from detsample.invariant import conv, cpu, moe
from detsample.invariant.attention import sdpa_flash_cpu, sdpa_math
from detsample.invariant.backends import cuda_kernels

FAMILIES = ("matmul", "reduction", "softmax", "norm", "pointwise", "convolution", "moe", "attention")


@dataclass(frozen=True)
class Override:
    """One aten op overload (``torch.library`` spelling), its family, its CPU kernel."""

    op: str
    family: str
    cpu: Callable

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")

    @property
    def aten_name(self) -> str:
        """``"aten::mean.dim"`` (``"aten::mm"`` for a default overload), as the coverage
        check names the ops a model runs."""
        return f"aten::{self.op}"


OVERRIDES: tuple[Override, ...] = (
    Override("mm", "matmul", cpu.mm),
    Override("addmm", "matmul", cpu.addmm),
    Override("bmm", "matmul", cpu.bmm),
    Override("baddbmm", "matmul", cpu.baddbmm),
    Override("mv", "matmul", cpu.mv),
    Override("dot", "matmul", cpu.dot),
    Override("sum", "reduction", cpu.sum_all),
    Override("sum.dim_IntList", "reduction", cpu.sum_dim),
    Override("mean", "reduction", cpu.mean_all),
    Override("mean.dim", "reduction", cpu.mean_dim),
    Override("_softmax", "softmax", cpu.softmax),
    Override("_log_softmax", "softmax", cpu.log_softmax),
    Override("_safe_softmax", "softmax", cpu.safe_softmax),
    Override("native_layer_norm", "norm", cpu.native_layer_norm),
    Override("silu", "pointwise", cpu.silu),
    Override("sigmoid", "pointwise", cpu.sigmoid),
    Override("gelu", "pointwise", cpu.gelu),
    Override("softplus", "pointwise", cpu.softplus),
    Override("tanh", "pointwise", cpu.tanh),
    Override("exp", "pointwise", cpu.exp),
    Override("expm1", "pointwise", cpu.expm1),
    Override("log", "pointwise", cpu.log),
    Override("cos", "pointwise", cpu.cos),
    Override("sin", "pointwise", cpu.sin),
    Override("sqrt", "pointwise", cpu.sqrt),
    Override("rsqrt", "pointwise", cpu.rsqrt),
    Override("pow.Tensor_Scalar", "pointwise", cpu.pow_scalar),
    Override("convolution", "convolution", conv.convolution),
    Override("topk", "moe", moe.topk),
    Override("_grouped_mm", "moe", moe.grouped_mm),
    Override("_scaled_dot_product_flash_attention_for_cpu", "attention", sdpa_flash_cpu),
    Override("_scaled_dot_product_attention_math", "attention", sdpa_math),
)


def kernels_by_key(cuda: Mapping[str, Callable] | None = None) -> dict[str, dict[str, Callable]]:
    """``{op: {"CPU": kernel, "CUDA": kernel?}}``: the CPU table plus ``cuda`` (op name ->
    kernel; ops only a CUDA kernel exists for are added for that key alone). ``cuda``
    defaults to the Triton kernels' ``CUDA_IMPLS`` when they and a CUDA device exist."""
    if cuda is None:
        cuda = cuda_kernels()
    table: dict[str, dict[str, Callable]] = {o.op: {"CPU": o.cpu} for o in OVERRIDES}
    for op, fn in (cuda or {}).items():
        if not callable(fn):
            raise TypeError(f"the CUDA kernel for {op!r} must be callable, got {type(fn).__name__}")
        table.setdefault(op, {})["CUDA"] = fn
    return table
