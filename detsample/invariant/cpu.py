"""Batch-invariant CPU kernels: each output row is a function of its own input row only.

Every function here takes the arguments of the aten op it replaces (same names, same
defaults) and returns what that op returns, so the mode can register it for the CPU
dispatch key. They call only aten ops the mode does NOT override (``mm.out``,
``sum.IntList_out``, ``silu.out``, ...), so a registered kernel never re-enters itself.
Each kernel follows the active configuration (:func:`detsample.invariant.state.config`):

===============  =============================================  ==============================================
family           verified (default)                             portable (``portable=True``)
===============  =============================================  ==============================================
matmul           BLAS in fixed row tiles, per column block,     the float32 nearest to the exact product:
                 the ladder verified on this machine            :mod:`~detsample.invariant.exact`
                 (:mod:`~detsample.invariant.products`)
reduction        torch's serial sum where verified, else the    the fixed tree (:mod:`~detsample.invariant.tree`)
                 fixed tree (:mod:`~detsample.invariant.reduce`)
pointwise        torch's vector loop (exp, log, tanh: MKL's     detsample's defined functions
(exp, expm1,     vector math; the others ATen's kernels),       (:mod:`detsample.arith.pointwise`: float64
log, tanh,       where verified; else detsample's defined       Estrin / Taylor / series definitions, rounded
sigmoid, silu,   function                                       once; the IEEE sqrt)
gelu, softplus,
cos, sin, sqrt,
rsqrt, pow)
softmax, norm    composed of the above (max is exact)           composed of the above
===============  =============================================  ==============================================

What each verified kernel rests on is checked at its first use on the running machine
(:mod:`detsample.invariant.verify`); a pointwise op that fails its check takes its
defined function instead, with a :class:`~detsample.invariant.verify.FallbackWarning`.

Reduced precision (bfloat16, float16) is computed in float32 and rounded once to the
input's dtype (verified pointwise ops: torch's own reduced-precision loop); integer and
complex tensors take the native kernel (exact or out of scope). Guarantee: bitwise
batch-invariant (rows) and thread-count-invariant; portable: the same bits on every
CPU, ISA, MKL instruction level, thread count and torch build (docs/batch-invariant.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch

from detsample.arith import pointwise as defined
from detsample.invariant.products import compute_dtype, product
from detsample.invariant.reduce import row_sum
from detsample.invariant.state import config, note_portable
from detsample.invariant.verify import FallbackWarning, pointwise_plan
from detsample.ops.vector import pointwise
from detsample.probe.threads import torch_threads

aten = torch.ops.aten


def _native(t: torch.Tensor) -> bool:
    """True when the native kernel is used as is (not a CPU floating-point tensor)."""
    return not t.is_cpu or not t.is_floating_point()


# -- matmul -------------------------------------------------------------------------------


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return product(a, b, config().portable)


def _rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype`` (itself when it is: a no-op ``to`` still costs a dispatch)."""
    return t if t.dtype == dtype else t.to(dtype)


def mm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """aten ``mm(self (M, K), mat2 (K, N)) -> (M, N)``: row i depends on ``self[i]`` and
    ``mat2`` only."""
    if _native(self) or _native(mat2) or self.dtype != mat2.dtype:
        out = self.new_empty((self.shape[0], mat2.shape[1]))
        return aten.mm.out(self, mat2, out=out)
    return _rounded(_product(self, mat2), self.dtype)


def bmm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """aten ``bmm(self (b, M, K), mat2 (b, K, N)) -> (b, M, N)``: a row depends on its
    own row and its matrix's ``mat2`` only (not on b or the other matrices)."""
    if _native(self) or _native(mat2) or self.dtype != mat2.dtype:
        out = self.new_empty((self.shape[0], self.shape[1], mat2.shape[2]))
        return aten.bmm.out(self, mat2, out=out)
    return _rounded(_product(self, mat2), self.dtype)


def _add_scaled(prod: torch.Tensor, bias: torch.Tensor, beta: Any, alpha: Any) -> torch.Tensor:
    """``beta * bias + alpha * prod`` elementwise (beta == 0 ignores ``bias``, as aten)."""
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        return prod
    return torch.add(bias if beta == 1 else bias * beta, prod)


def addmm(self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    """aten ``addmm``: ``beta * self + alpha * mm(mat1, mat2)``, the bias added after the
    whole product (one rounding), so a row depends on its own row only."""
    if _native(mat1) or _native(mat2) or mat1.dtype != mat2.dtype:
        return aten.addmm.out(
            self, mat1, mat2, beta=beta, alpha=alpha, out=mat1.new_empty((mat1.shape[0], mat2.shape[1]))
        )
    prod = _product(mat1, mat2)
    return _add_scaled(prod, self.to(prod.dtype), beta, alpha).to(mat1.dtype)


def baddbmm(
    self: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> torch.Tensor:
    """aten ``baddbmm``: ``beta * self + alpha * bmm(batch1, batch2)``."""
    if _native(batch1) or _native(batch2) or batch1.dtype != batch2.dtype:
        shape = (batch1.shape[0], batch1.shape[1], batch2.shape[2])
        return aten.baddbmm.out(self, batch1, batch2, beta=beta, alpha=alpha, out=batch1.new_empty(shape))
    prod = _product(batch1, batch2)
    return _add_scaled(prod, self.to(prod.dtype), beta, alpha).to(batch1.dtype)


def mv(self: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
    """aten ``mv(self (M, K), vec (K,)) -> (M,)``: a one-column ``mm``."""
    if _native(self) or _native(vec) or self.dtype != vec.dtype:
        return aten.mv.out(self, vec, out=self.new_empty((self.shape[0],)))
    return mm(self, vec.unsqueeze(1)).squeeze(1)


def dot(self: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """aten ``dot(self (K,), tensor (K,)) -> ()``: a one-row, one-column ``mm``."""
    if _native(self) or _native(tensor) or self.dtype != tensor.dtype:
        return aten.dot.out(self, tensor, out=self.new_empty(()))
    return mm(self.unsqueeze(0), tensor.unsqueeze(1)).reshape(())


# -- reductions ---------------------------------------------------------------------------


def _row_sum(x: torch.Tensor) -> torch.Tensor:
    return row_sum(x, config().portable)


def _reduce_dims(x: torch.Tensor, dim: Sequence[int] | int | None) -> list[int]:
    nd = x.dim()
    if dim is None:
        return list(range(nd))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:  # aten: an empty dim list reduces every dim
        return list(range(nd))
    return sorted({d % nd for d in dims}) if nd else []


def _sum_over(x: torch.Tensor, dims: list[int], keepdim: bool) -> torch.Tensor:
    """Sum over ``dims`` as rows: the kept dims first, the reduced ones flattened last."""
    nd = x.dim()
    keep = [d for d in range(nd) if d not in dims]
    n = 1
    for d in dims:
        n *= x.shape[d]
    if not nd:
        rows = x.reshape(1, 1)
    elif dims == list(range(nd - len(dims), nd)):  # the trailing dims: the permute is the identity
        rows = x.reshape(-1, n)
    else:
        rows = x.permute(keep + dims).reshape(-1, n)
    return _row_sum(rows).reshape(_reduced_shape(x, dims, keepdim))


def _reduced_shape(x: torch.Tensor, dims: list[int], keepdim: bool) -> list[int]:
    return [1 if d in dims else n for d, n in enumerate(x.shape) if keepdim or d not in dims]


def _sum_dtype(x: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    return x.dtype if x.dtype.is_floating_point or x.dtype.is_complex else torch.int64


def sum_dim(
    self: torch.Tensor, dim: Sequence[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """aten ``sum.dim_IntList``: each output element is one row's invariant sum
    (integer and complex tensors: the native kernel)."""
    dims = _reduce_dims(self, dim)
    out_dtype = _sum_dtype(self, dtype)
    if _native(self) or not out_dtype.is_floating_point:
        out = self.new_empty(_reduced_shape(self, dims, keepdim), dtype=out_dtype)
        return aten.sum.IntList_out(self, dims, keepdim, dtype=dtype, out=out)
    ct = compute_dtype(out_dtype)
    return _rounded(_sum_over(_rounded(self, ct), dims, keepdim), out_dtype)


def sum_all(self: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten ``sum``: every element, as one row."""
    return sum_dim(self, None, False, dtype=dtype)


def mean_dim(
    self: torch.Tensor, dim: Sequence[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """aten ``mean.dim``: the invariant sum divided by the element count (torch's CPU
    mean is ``sum / count`` too)."""
    dims = _reduce_dims(self, dim)
    out_dtype = dtype if dtype is not None else self.dtype
    if _native(self) or not out_dtype.is_floating_point:
        out = self.new_empty(_reduced_shape(self, dims, keepdim), dtype=out_dtype)
        return aten.mean.out(self, dims, keepdim, dtype=dtype, out=out)
    n = 1
    for d in dims:
        n *= self.shape[d]
    ct = compute_dtype(out_dtype)
    return _rounded(_sum_over(_rounded(self, ct), dims, keepdim) / n, out_dtype)


def mean_all(self: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten ``mean``: every element, as one row."""
    return mean_dim(self, None, False, dtype=dtype)


# -- pointwise ----------------------------------------------------------------------------


def _positive(t: torch.Tensor) -> torch.Tensor:
    return t.abs() + 1e-3


#: each pointwise op's function defined by detsample (:mod:`detsample.arith.pointwise`):
#: the portable kernel, and the verified kernel where torch's fails its check here
_DEFINED: dict[str, Callable[..., torch.Tensor]] = {
    "exp": defined.exp,
    "expm1": defined.expm1,
    "log": defined.log,
    "tanh": defined.tanh,
    "sigmoid": defined.sigmoid,
    "silu": defined.silu,
    "softplus": defined.softplus,
    "gelu": defined.gelu,
    "cos": defined.cos,
    "sin": defined.sin,
    "sqrt": defined.sqrt,
    "rsqrt": defined.rsqrt,
    "pow": defined.pow_scalar,
}


def _require(
    name: str,
    out_op: Callable[..., torch.Tensor],
    dtype: torch.dtype,
    args: tuple = (),
    kwargs: dict | None = None,
    domain: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> Any:
    """None when op ``name`` failed its on-machine check, else the context to run it in
    (1 thread where its check at this thread count failed)."""
    plan = pointwise_plan(name, out_op, dtype, args, kwargs, domain)
    if plan.kernel == "refused":
        return None
    return torch_threads(1) if plan.data[0] else nullcontext()


def _defined(name: str, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """detsample's ``name`` of floating ``x`` (its dtype; half precision through float32)."""
    note_portable(("pointwise", name, x.dtype, args, tuple(sorted(kwargs.items())), "portable"), f"defined {name}")
    return _DEFINED[name](x, *args, **kwargs)


def _pointwise(
    name: str,
    out_op: Callable[..., torch.Tensor],
    x: torch.Tensor,
    args: tuple,
    kwargs: dict,
    domain: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Op ``name`` of a floating CPU tensor: the defined function under ``portable``, else
    torch's vector loop where verified here, else the defined function (with a
    :class:`FallbackWarning`)."""
    if config().portable:
        return _defined(name, x, *args, **kwargs)
    ctx = _require(name, out_op, x.dtype, args, kwargs, domain)
    if ctx is not None:
        with ctx:
            return pointwise(out_op, x, *args, **kwargs)
    warnings.warn(
        f"batch-invariant mode: torch's {name} is not invariant on this machine; "
        f"it takes detsample's defined {name} instead",
        FallbackWarning,
        stacklevel=3,
    )
    return _defined(name, x, *args, **kwargs)


def _unary(
    name: str,
    out_op: Callable[..., torch.Tensor],
    native: Callable[..., torch.Tensor],
    domain: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
):
    def impl(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if _native(self):
            return out_op(self, *args, out=native(self, *args, **kwargs), **kwargs)
        return _pointwise(name, out_op, self, args, kwargs, domain)

    impl.__name__ = name
    impl.__doc__ = (
        f"aten ``{name}``: elementwise; detsample's defined {name} under "
        f"``portable``, else torch's vector loop "
        f"(:func:`~detsample.ops.vector.pointwise`) where verified here."
    )
    return impl


def _like(self: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
    return torch.empty_like(self)


def _float_like(self: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
    """Output of a unary float op: integers and bools promote to the default dtype."""
    if self.dtype.is_floating_point or self.dtype.is_complex:
        return torch.empty_like(self)
    return torch.empty_like(self, dtype=torch.get_default_dtype())


silu = _unary("silu", aten.silu.out, _like)
sigmoid = _unary("sigmoid", aten.sigmoid.out, _float_like)
gelu = _unary("gelu", aten.gelu.out, _like)
softplus = _unary("softplus", aten.softplus.out, _like)
tanh = _unary("tanh", aten.tanh.out, _float_like)
exp = _unary("exp", aten.exp.out, _float_like)
expm1 = _unary("expm1", aten.expm1.out, _float_like)
log = _unary("log", aten.log.out, _float_like, _positive)
cos = _unary("cos", aten.cos.out, _float_like)
sin = _unary("sin", aten.sin.out, _float_like)
sqrt = _unary("sqrt", aten.sqrt.out, _float_like, _positive)
rsqrt = _unary("rsqrt", aten.rsqrt.out, _float_like, _positive)


def pow_scalar(self: torch.Tensor, exponent: Any) -> torch.Tensor:
    """aten ``pow.Tensor_Scalar``: detsample's defined pow under ``portable``, else the
    vector path where verified here (a complex exponent: torch's kernel)."""
    if _native(self) or isinstance(exponent, complex):
        return aten.pow.Tensor_Scalar_out(
            self, exponent, out=torch.empty_like(self, dtype=torch.result_type(self, exponent))
        )
    domain = (lambda t: t) if float(exponent).is_integer() else _positive
    return _pointwise("pow", aten.pow.Tensor_Scalar_out, self, (exponent,), {}, domain)


# -- softmax and normalisation ------------------------------------------------------------


def _rows_last(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    moved = x.movedim(dim, -1)
    return moved.reshape(-1, moved.shape[-1]) if x.dim() else x.reshape(1, 1), moved.shape


def _softmax_like(x: torch.Tensor, dim: int, half_to_float: bool, log_: bool) -> torch.Tensor:
    out_dtype = torch.float32 if half_to_float else x.dtype
    if x.numel() == 0:
        return torch.empty_like(x, dtype=out_dtype)
    dim = dim % x.dim() if x.dim() else 0
    rows, moved_shape = _rows_last(x.to(compute_dtype(x.dtype)), dim)
    z = rows - rows.amax(dim=1, keepdim=True)  # max is exact: order-free
    e = exp(z)
    s = _row_sum(e).unsqueeze(1)
    y = z - log(s) if log_ else e / s
    y = y.reshape(moved_shape).movedim(-1, dim) if x.dim() else y.reshape(())
    return y.to(out_dtype).contiguous()


def softmax(self: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    """aten ``_softmax``: ``exp(x - max) / sum``, per slice along ``dim``."""
    if _native(self):
        return aten._softmax.out(self, dim, half_to_float, out=torch.empty_like(self))
    return _softmax_like(self, dim, half_to_float, log_=False)


def log_softmax(self: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    """aten ``_log_softmax``: ``(x - max) - log(sum(exp(x - max)))``, per slice."""
    if _native(self):
        return aten._log_softmax.out(self, dim, half_to_float, out=torch.empty_like(self))
    return _softmax_like(self, dim, half_to_float, log_=True)


def safe_softmax(self: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten ``_safe_softmax``: softmax, with 0 for a slice that is entirely ``-inf``."""
    x = self if dtype is None else self.to(dtype)
    if _native(x):
        raise RuntimeError(f"softmax needs a floating dtype, got {x.dtype}")
    y = _softmax_like(x, dim, False, log_=False)
    dead = (x == float("-inf")).all(dim=dim, keepdim=True)
    return torch.where(dead, 0.0, y).to(y.dtype)


def native_layer_norm(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aten ``native_layer_norm -> (out, mean, rstd)``: two-pass mean and variance by the
    invariant row sum, per row of the trailing ``normalized_shape``."""
    k = len(normalized_shape)
    if tuple(input.shape[input.dim() - k :]) != tuple(normalized_shape):
        raise RuntimeError(
            f"normalized_shape {tuple(normalized_shape)} does not match the trailing dims of input {tuple(input.shape)}"
        )
    n = 1
    for s in normalized_shape:
        n *= s
    ct = compute_dtype(input.dtype)
    x = input.to(ct).reshape(-1, n)
    mean = (_row_sum(x) / n).unsqueeze(1)
    xc = x - mean
    var = (_row_sum(xc * xc) / n).unsqueeze(1)
    rstd = rsqrt(var + eps)
    out = xc * rstd
    if weight is not None:
        out = out * weight.to(ct).reshape(1, n)
    if bias is not None:
        out = out + bias.to(ct).reshape(1, n)
    stat_shape = tuple(input.shape[: input.dim() - k]) + (1,) * k
    return (out.reshape(input.shape).to(input.dtype), mean.reshape(stat_shape), rstd.reshape(stat_shape))
