"""The batch-invariant mode's CUDA implementations, keyed by aten op name.

``CUDA_IMPLS[name]`` takes the aten op's arguments (same names, same defaults) and
returns what the aten op returns, computed by the fixed-order kernels of
:mod:`detsample.kernels.matmul` (fixed tiles, no split-K),
:mod:`detsample.kernels.rowwise` (one program per row) and
:mod:`detsample.kernels.logprobs` (``_log_softmax``: detsample.arith's definition).
Transcendentals: ``_log_softmax`` is detsample.arith's (exp64, the exact two-word sum,
log64), ``_softmax`` / ``_safe_softmax`` take arith's ``exp`` (then a fixed float32 tree
and ``div_rn``): their bits follow IEEE operations only, not a GPU's approximate
``ex2`` / ``lg2``. The attention keeps ``tl.exp``: one exp per score inside the
product loop, where float64 arithmetic would cost a multiple of the attention's time
and the MMA's bits are already the GPU kind's (docs/gpu.md). The mode registers them for the
CUDA dispatch key; each is a plain function of its tensors (no state).
``ATTENTION`` is the transformers ``AttentionInterface`` function with a fixed KV split
(:func:`detsample.kernels.attention.hf_attention`).

On CPU tensors the same functions run under the Triton interpreter, which is how the
tests check them; they are not meant as the CPU implementation of the mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from detsample.kernels import logprobs, matmul, rowwise
from detsample.kernels.attention import attention, hf_attention


def _softmax_like(x: torch.Tensor, dim: int, half_to_float: bool, log: bool) -> torch.Tensor:
    if x.dim() == 0:
        x = x.reshape(1)
        return _softmax_like(x, 0, half_to_float, log).reshape(())
    dim = dim % x.dim()
    out_dtype = torch.float32 if half_to_float else x.dtype
    moved = x.movedim(dim, -1).contiguous()
    rows = moved.reshape(-1, moved.shape[-1])
    if log:  # detsample.arith's log_softmax, in float32, rounded once more to out_dtype
        y = logprobs.log_softmax_rows(rows.to(torch.float32)).to(out_dtype)
    else:
        y = rowwise.softmax_rows(rows, out_dtype=out_dtype)
    return y.reshape(moved.shape).movedim(-1, dim).contiguous()


def softmax(self: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    """aten ``_softmax(self, dim, half_to_float)``: one program per slice along ``dim``."""
    return _softmax_like(self, dim, half_to_float, log=False)


def log_softmax(self: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    """aten ``_log_softmax(self, dim, half_to_float)``: one program per slice, the bits of
    :func:`detsample.arith.log_softmax` of the slice in float32 (bfloat16 / float16
    upcast exactly, float64 rounded to float32), rounded to the output dtype; a slice
    with a NaN, a +inf or no finite value is NaN (aten: NaN for NaN / +inf slices too)."""
    return _softmax_like(self, dim, half_to_float, log=True)


def safe_softmax(self: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten ``_safe_softmax(self, dim, dtype=None)``: softmax, zeros for a slice of only
    ``-inf`` (the attention masks' fully masked rows)."""
    x = self if dtype is None else self.to(dtype)
    dim = dim % max(x.dim(), 1)
    moved = x.movedim(dim, -1).contiguous() if x.dim() else x.reshape(1)
    y = rowwise.softmax_rows(moved.reshape(-1, moved.shape[-1]), safe=True)
    return y.reshape(moved.shape).movedim(-1, dim).contiguous() if x.dim() else y.reshape(())


def _reduce(x: torch.Tensor, dim: Sequence[int] | int | None, keepdim: bool, mean: bool) -> torch.Tensor:
    """Sum or mean over ``dim`` (None or []: every dim), one program per kept index."""
    nd = x.dim()
    if dim is None:
        dims = list(range(nd))
    elif isinstance(dim, int):
        dims = [dim]
    else:
        dims = list(dim) or list(range(nd))  # aten: an empty list reduces every dim
    dims = sorted({d % nd for d in dims}) if nd else []
    keep = [d for d in range(nd) if d not in dims]
    n = 1
    for d in dims:
        n *= x.shape[d]
    rows = x.permute(keep + dims).contiguous().reshape(-1, n) if nd else x.reshape(1, 1)
    out = rowwise.sum_rows(rows, mean=mean).reshape([x.shape[d] for d in keep])
    if keepdim:
        out = out.reshape([1 if d in dims else x.shape[d] for d in range(nd)])
    return out


def mean_dim(
    self: torch.Tensor, dim: Sequence[int] | int | None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """aten ``mean.dim(self, dim, keepdim=False, *, dtype=None)``: the reduced dims are
    moved last and each remaining index is one program (fixed block order)."""
    x = self if dtype is None else self.to(dtype)
    if not x.dtype.is_floating_point:
        raise ValueError(f"mean needs a floating dtype, got {x.dtype}")
    return _reduce(x, dim, keepdim, mean=True)


def mean(self: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten ``mean(self, *, dtype=None)``: every element, as one row."""
    return mean_dim(self, None, False, dtype=dtype)


def sum_dim(
    self: torch.Tensor, dim: Sequence[int] | int | None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """aten ``sum.dim_IntList(self, dim, keepdim=False, *, dtype=None)``: floating sums by
    one program per kept index; integer and bool tensors (exact sums) by the native
    ``sum.IntList_out`` kernel, which the mode does not override."""
    if not (self.dtype if dtype is None else dtype).is_floating_point:
        dims = [] if dim is None else ([dim] if isinstance(dim, int) else list(dim))
        out_dtype = dtype or (torch.int64 if not self.dtype.is_floating_point else self.dtype)
        ref = torch.empty((0,), dtype=out_dtype, device=self.device)
        return torch.ops.aten.sum.IntList_out(self, dims, keepdim, dtype=dtype, out=ref)
    return _reduce(self if dtype is None else self.to(dtype), dim, keepdim, mean=False)


def sum_all(self: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten ``sum(self, *, dtype=None)``: every element, as one row."""
    return sum_dim(self, None, False, dtype=dtype)


def _rms_setup(
    input: torch.Tensor, normalized_shape: Sequence[int], eps: float | None
) -> tuple[torch.Tensor, int, float]:
    k = len(normalized_shape)
    if tuple(input.shape[input.dim() - k :]) != tuple(normalized_shape):
        raise ValueError(
            f"normalized_shape {tuple(normalized_shape)} does not match the trailing dims of input {tuple(input.shape)}"
        )
    n = 1
    for s in normalized_shape:
        n *= s
    if eps is None:  # aten: the epsilon of the compute (opmath) dtype
        eps = torch.finfo(torch.float64 if input.dtype == torch.float64 else torch.float32).eps
    return input.contiguous().reshape(-1, n), n, float(eps)


def rms_norm(
    input: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None, eps: float | None = None
) -> torch.Tensor:
    """aten ``rms_norm(input, normalized_shape, weight=None, eps=None)``: one program per
    row of the trailing ``normalized_shape``; ``eps=None`` is the compute dtype's epsilon."""
    x2, _, e = _rms_setup(input, normalized_shape, eps)
    return rowwise.rms_norm_rows(x2, weight, e)[0].reshape(input.shape)


def fused_rms_norm(
    input: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None, eps: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """aten ``_fused_rms_norm``: ``(output, rstd)`` with rstd shaped like input with the
    normalised dims kept as 1."""
    x2, _, e = _rms_setup(input, normalized_shape, eps)
    out, rstd = rowwise.rms_norm_rows(x2, weight, e)
    k = len(normalized_shape)
    return (out.reshape(input.shape), rstd.reshape(tuple(input.shape[: input.dim() - k]) + (1,) * k))


def mm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """aten ``mm(self, mat2)``: fixed tiles, no split-K."""
    return matmul.mm(self, mat2)


def addmm(self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    """aten ``addmm(self, mat1, mat2, *, beta=1, alpha=1)``."""
    return matmul.addmm(self, mat1, mat2, beta=beta, alpha=alpha)


def baddbmm(self: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    """aten ``baddbmm(self, batch1, batch2, *, beta=1, alpha=1)``."""
    return matmul.baddbmm(self, batch1, batch2, beta=beta, alpha=alpha)


def mv(self: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
    """aten ``mv(self (M, K), vec (K,)) -> (M,)``: a one-column ``mm``."""
    return matmul.mm(self, vec.unsqueeze(1)).squeeze(1)


def dot(self: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """aten ``dot(self (K,), tensor (K,)) -> ()``: a one-row, one-column ``mm``."""
    return matmul.mm(self.unsqueeze(0), tensor.unsqueeze(1)).reshape(())


def native_layer_norm(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aten ``native_layer_norm -> (out, mean, rstd)``; mean and rstd shaped like input
    with the normalised dims kept as 1, in the compute dtype."""
    x2, _, e = _rms_setup(input, normalized_shape, eps)
    out, mu, rstd = rowwise.layer_norm_rows(x2, weight, bias, e)
    k = len(normalized_shape)
    stat = tuple(input.shape[: input.dim() - k]) + (1,) * k
    return out.reshape(input.shape), mu.reshape(stat), rstd.reshape(stat)


def bmm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """aten ``bmm(self, mat2)``."""
    return matmul.bmm(self, mat2)


CUDA_IMPLS: dict[str, Callable] = {
    "mm": mm,
    "addmm": addmm,
    "bmm": bmm,
    "baddbmm": baddbmm,
    "mv": mv,
    "dot": dot,
    "sum": sum_all,
    "sum.dim_IntList": sum_dim,
    "mean": mean,
    "mean.dim": mean_dim,
    "_softmax": softmax,
    "_log_softmax": log_softmax,
    "_safe_softmax": safe_softmax,
    "rms_norm": rms_norm,
    "_fused_rms_norm": fused_rms_norm,
    "native_layer_norm": native_layer_norm,
}

#: transformers AttentionInterface function (register as "detsample")
ATTENTION: Callable = hf_attention

__all__ = ["ATTENTION", "CUDA_IMPLS", "attention"]
