"""detsample's defined pointwise functions on tensors: ``exp``, ``expm1``, ``log``,
``tanh``, ``sigmoid``, ``silu``, ``softplus``, ``gelu``, ``cos``, ``sin``, ``sqrt``,
``rsqrt`` and ``pow_scalar``, whose bits are their definitions (:mod:`detsample.arith.elementary`,
:mod:`detsample.arith.trig`, :mod:`detsample.arith.spec`), the same on every CPU and
device. The batch-invariant mode's portable kernels run them.

Dtypes: a float64 tensor gives the float64 definition; float32 is computed in float64 and
rounded once; bfloat16 and float16 take the float32 function and round once more. NaNs
come out as the canonical quiet NaN of the dtype. Functions take ``impl``: ``"auto"``
(numba on CPU tensors when importable, else the torch composition), ``"numba"`` or
``"torch"``; the two are equal bit for bit (tests/arith). A large CPU call is split over
``torch.get_num_threads()`` threads by contiguous spans: every element is a function of
its own input, so the split changes no bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from detsample.arith import cpu, elementary, elementary_torch, reference, trig_torch, uses_numba
from detsample.arith import exp as exp32

__all__ = [
    "FUNCTIONS",
    "exp",
    "expm1",
    "log",
    "tanh",
    "sigmoid",
    "silu",
    "softplus",
    "gelu",
    "cos",
    "sin",
    "sqrt",
    "rsqrt",
    "pow_scalar",
]

#: the functions of this module by their aten names
FUNCTIONS = ("exp", "expm1", "log", "tanh", "sigmoid", "silu", "softplus", "gelu", "cos", "sin", "sqrt", "rsqrt", "pow")
HALF = (torch.bfloat16, torch.float16)


@functools.cache
def _kernels(module: str):
    """The numba kernels module ``module`` (``"elementary_jit"`` / ``"trig_jit"``)."""
    import importlib

    return importlib.import_module(f"detsample.arith.{module}")


def _check(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"arith.pointwise.{name} takes a floating tensor, got {got}")


def _apply(
    x: torch.Tensor, name: str, kernel: tuple[str, str], composed: Callable, args: tuple = (), impl: str = "auto"
) -> torch.Tensor:
    """``name`` of ``x`` by the numba ``kernel`` (module, loop) with extra ``args``, or
    by ``composed`` (float64 -> float64 torch composition, same args)."""
    _check(x, name)
    if x.dtype in HALF:
        return _apply(x.to(torch.float32), name, kernel, composed, args, impl).to(x.dtype)
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"arith.pointwise.{name} takes float64, float32, bfloat16 or float16, got {x.dtype}")
    if uses_numba(x, impl):
        src = x.contiguous()
        out = torch.empty_like(src)
        a, b = src.view(-1).numpy(), out.view(-1).numpy()
        k = getattr(_kernels(kernel[0]), kernel[1])
        cpu.split_rows(lambda s, e: k(a[s:e], b[s:e], *args), a.size, a.size)
        return out
    y = composed(x.to(torch.float64), *args)
    if x.dtype == torch.float64:
        return y
    y = y.to(x.dtype)
    return y.masked_fill_(torch.isnan(y), float("nan"))  # one NaN on every device


def exp(x: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """e**x (float32: detsample.arith.exp's bits, which are these rounded once)."""
    _check(x, "exp")
    if x.dtype == torch.float32:
        return exp32(x, impl=impl)
    return _apply(x, "exp", ("elementary_jit", "exp_into"), elementary_torch.exp, (), impl)


def expm1(x: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """e**x - 1, without cancellation near 0."""
    return _apply(x, "expm1", ("elementary_jit", "expm1_into"), elementary_torch.expm1, (), impl)


def log(x: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """Natural log: :mod:`detsample.arith.spec`'s ``log64``."""
    return _apply(x, "log", ("elementary_jit", "log_into"), reference.log64, (), impl)


def tanh(x: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    return _apply(x, "tanh", ("elementary_jit", "tanh_into"), elementary_torch.tanh, (), impl)


def sigmoid(x: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    return _apply(x, "sigmoid", ("elementary_jit", "sigmoid_into"), elementary_torch.sigmoid, (), impl)


def silu(x: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    return _apply(x, "silu", ("elementary_jit", "silu_into"), elementary_torch.silu, (), impl)


def softplus(x: torch.Tensor, beta: float = 1.0, threshold: float = 20.0, *, impl: str = "auto") -> torch.Tensor:
    """torch's ``softplus(x, beta, threshold)``: ``x`` where ``x * beta > threshold``, else
    ``log1p(exp(x * beta)) / beta``."""
    b, t = _real(beta, "beta"), _real(threshold, "threshold")
    if b == 0.0:
        raise ValueError("softplus's beta must not be 0, got 0")
    return _apply(x, "softplus", ("elementary_jit", "softplus_into"), elementary_torch.softplus, (b, t), impl)


def gelu(x: torch.Tensor, approximate: str = "none", *, impl: str = "auto") -> torch.Tensor:
    """``x Phi(x)`` (``approximate="none"``) or torch's tanh form (``"tanh"``)."""
    elementary.check_gelu_form(approximate)
    if approximate == "tanh":
        return _apply(x, "gelu", ("elementary_jit", "gelu_tanh_into"), elementary_torch.gelu_tanh, (), impl)
    return _apply(x, "gelu", ("elementary_jit", "gelu_erf_into"), elementary_torch.gelu_erf, (), impl)


def cos(x: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    return _apply(x, "cos", ("trig_jit", "cos_into"), trig_torch.cos, (), impl)


def sin(x: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    return _apply(x, "sin", ("trig_jit", "sin_into"), trig_torch.sin, (), impl)


def sqrt(x: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """The IEEE square root (correctly rounded), in float64 rounded once."""
    return _apply(x, "sqrt", ("elementary_jit", "sqrt_into"), elementary_torch.sqrt, (), impl)


def rsqrt(x: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """``1 / sqrt(x)`` in float64, rounded once."""
    return _apply(x, "rsqrt", ("elementary_jit", "rsqrt_into"), elementary_torch.rsqrt, (), impl)


def pow_scalar(x: torch.Tensor, exponent: Any, *, impl: str = "auto") -> torch.Tensor:
    """``x ** exponent`` for a real scalar ``exponent`` (the definition's cases: sqrt,
    rsqrt, square-and-multiply for small integers, ``exp(e log|x|)`` otherwise)."""
    kind = elementary.pow_kind(exponent)
    e = float(exponent)
    if kind == 2:
        return sqrt(x, impl=impl)
    if kind == 3:
        return rsqrt(x, impl=impl)
    if kind == 1:
        return _apply(x, "pow", ("elementary_jit", "pow_int_into"), elementary_torch.pow_int, (int(e),), impl)
    odd = elementary.is_odd_integer(e)
    return _apply(x, "pow", ("elementary_jit", "pow_general_into"), elementary_torch.pow_general, (e, odd), impl)


def _real(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{name} must be a real number, got {v!r}")
    return float(v)
