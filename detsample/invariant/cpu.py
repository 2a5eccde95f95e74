"""Batch-invariant CPU kernels: each output row is a function of its own input row only.

Every function here takes the arguments of the aten op it replaces (same names, same
defaults) and returns what that op returns, so the mode can register it for the CPU
dispatch key. They call only aten ops the mode does NOT override (``mm.out``,
``sum.IntList_out``, ``silu.out``, ...), so a registered kernel never re-enters itself.

What each family relies on, all measured on this machine class and pinned by
tests/invariant/test_cpu.py (a kernel change that breaks one fails there first):

* matmul (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``mv``, ``dot``): MKL's sgemm gives a
  row of ``A @ B`` the same bits for every row count M in {4, 8} or >= 12 when ``B`` has
  ``N >= 16`` columns, whatever the row's position, its neighbours, the row alignment,
  B's layout and the thread count (1 to 4). 1-3-row products take another kernel, and
  2 threads split a 5-7 or 9-11-row product into parts of which one has 1-3 rows; with
  fewer than 12 columns the result even depends on A's address. So every product runs
  with :func:`padded_rows` rows (M rounded up to a multiple of 4 below 12) and at least
  :data:`MIN_COLS` columns, zero rows / columns padding the rest. ``addmm`` is
  ``beta * self + alpha * (A @ B)`` with the bias added once, after the product.
* reductions (``sum.dim_IntList``, ``mean.dim``): torch reduces a contiguous row with
  the same vectorised loop whatever the row count, unless one call holds
  ``GRAIN_SIZE`` (32768) elements or more, where 2 threads may split a row. Rows are
  therefore reduced in calls of fewer than :data:`GRAIN` elements (one serial loop
  each), and rows longer than :data:`CHUNK` in fixed column chunks from column 0,
  whose partial sums are reduced again. ``mean`` is that sum divided by the count, as
  torch's CPU mean is.
* pointwise transcendental ops (``silu``, ``exp``, ``cos``, ...): torch runs a
  contiguous tensor through a vector loop and its last ``numel % 16`` elements (and each
  thread's chunk's tail) through a scalar loop whose formula rounds differently (silu,
  sigmoid, tanh-gelu, pow measured here). The input is copied into a buffer padded to
  a multiple of :data:`PAD` elements and run in blocks of :data:`BLOCK` elements, so
  every element takes the vector path.
* softmax, log_softmax, layer_norm: composed from the above (max is exact).

Reduced precision (bfloat16, float16) is computed in float32 and rounded once to the
input's dtype; integer and complex tensors take the native kernel (exact or out of
scope). Guarantee: bitwise batch-invariant (rows), thread-count-invariant (1, 2).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

aten = torch.ops.aten

ROW_STEP = 4      # matmul rows below ALL_ROWS are padded to a multiple of this
ALL_ROWS = 12     # from here on every row count is invariant (measured)
MIN_COLS = 16     # matmul output columns per call, at least
GRAIN = 32768     # torch's at::internal::GRAIN_SIZE: calls below it run one serial loop
CHUNK = 8192      # longest row reduced in one piece; longer rows in chunks from column 0
PAD = 64          # pointwise buffers: a multiple of every vector loop's step
BLOCK = 16384     # pointwise elements per call (a multiple of PAD, below GRAIN)

_REDUCED = (torch.bfloat16, torch.float16)


def _native(t: torch.Tensor) -> bool:
    """True when the native kernel is used as is (not a CPU floating-point tensor)."""
    return t.device.type != "cpu" or not t.dtype.is_floating_point


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _REDUCED else dtype


# -- matmul -------------------------------------------------------------------------------

def _pad_to(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``t`` with zeros appended along ``dim`` up to ``size`` (``t`` itself if long enough)."""
    if t.shape[dim] >= size:
        return t
    shape = list(t.shape)
    shape[dim] = size
    out = t.new_zeros(shape)
    out.narrow(dim, 0, t.shape[dim]).copy_(t)
    return out


def padded_rows(m: int) -> int:
    """The row count a product of ``m`` rows runs with: ``m`` from ALL_ROWS on, else ``m``
    rounded up to a multiple of ROW_STEP (1-3 -> 4, 5-7 -> 8, 9-11 -> 12)."""
    return m if m >= ALL_ROWS else max(ROW_STEP, -(-m // ROW_STEP) * ROW_STEP)


def product(a: torch.Tensor, b: torch.Tensor, batched: bool) -> torch.Tensor:
    """``a @ b`` (``(M, K) x (K, N)``, or batched) with :func:`padded_rows` rows and at
    least MIN_COLS columns, in the compute dtype (float32 for reduced-precision inputs:
    the caller rounds once)."""
    ct = _compute_dtype(a.dtype)
    if ct != a.dtype:
        a, b = a.to(ct), b.to(ct)
    M, N = a.shape[-2], b.shape[-1]
    ap = _pad_to(a, 1 if batched else 0, padded_rows(M))
    bp = _pad_to(b, 2 if batched else 1, MIN_COLS)
    shape = (ap.shape[0], ap.shape[1], bp.shape[2]) if batched else (ap.shape[0], bp.shape[1])
    out = ap.new_empty(shape)
    (aten.bmm.out if batched else aten.mm.out)(ap, bp, out=out)
    if ap is not a or bp is not b:
        out = out[..., :M, :N].contiguous()
    return out


def mm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """aten ``mm(self (M, K), mat2 (K, N)) -> (M, N)``: row i depends on ``self[i]`` and
    ``mat2`` only."""
    if _native(self) or _native(mat2) or self.dtype != mat2.dtype:
        out = self.new_empty((self.shape[0], mat2.shape[1]))
        return aten.mm.out(self, mat2, out=out)
    return product(self, mat2, batched=False).to(self.dtype)


def bmm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """aten ``bmm(self (b, M, K), mat2 (b, K, N)) -> (b, M, N)``: a row depends on its
    own row and its matrix's ``mat2`` only (not on b or the other matrices)."""
    if _native(self) or _native(mat2) or self.dtype != mat2.dtype:
        out = self.new_empty((self.shape[0], self.shape[1], mat2.shape[2]))
        return aten.bmm.out(self, mat2, out=out)
    return product(self, mat2, batched=True).to(self.dtype)


def _add_scaled(prod: torch.Tensor, bias: torch.Tensor, beta: Any, alpha: Any) -> torch.Tensor:
    """``beta * bias + alpha * prod`` elementwise (beta == 0 ignores ``bias``, as aten)."""
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        return prod
    return torch.add(bias if beta == 1 else bias * beta, prod)


def addmm(self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Any = 1,
          alpha: Any = 1) -> torch.Tensor:
    """aten ``addmm``: ``beta * self + alpha * mm(mat1, mat2)``, the bias added after the
    whole product (one rounding), so a row depends on its own row only."""
    if _native(mat1) or _native(mat2):
        return aten.addmm.out(self, mat1, mat2, beta=beta, alpha=alpha,
                              out=mat1.new_empty((mat1.shape[0], mat2.shape[1])))
    prod = product(mat1, mat2, batched=False)
    return _add_scaled(prod, self.to(prod.dtype), beta, alpha).to(mat1.dtype)


def baddbmm(self: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta: Any = 1,
            alpha: Any = 1) -> torch.Tensor:
    """aten ``baddbmm``: ``beta * self + alpha * bmm(batch1, batch2)``."""
    if _native(batch1) or _native(batch2):
        shape = (batch1.shape[0], batch1.shape[1], batch2.shape[2])
        return aten.baddbmm.out(self, batch1, batch2, beta=beta, alpha=alpha,
                                out=batch1.new_empty(shape))
    prod = product(batch1, batch2, batched=True)
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

def row_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of each row of a 2-D floating tensor ``(R, N) -> (R,)`` in the tensor's dtype.

    Row r's bits depend on ``x[r]`` only: rows are summed by calls of fewer than GRAIN
    elements (torch's serial vectorised loop), rows longer than CHUNK in chunks from
    column 0 whose partial sums are summed again the same way.
    """
    R, N = x.shape
    if N > CHUNK:
        parts = [row_sum(x[:, c: c + CHUNK].contiguous()) for c in range(0, N, CHUNK)]
        return row_sum(torch.stack(parts, dim=1))
    x = x.contiguous()
    out = x.new_empty((R,))
    if R == 0:
        return out
    if N == 0:
        return out.zero_()
    step = max(1, (GRAIN - 1) // N)
    for r in range(0, R, step):
        aten.sum.IntList_out(x[r: r + step], [1], out=out[r: r + step])
    return out


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
    rows = x.permute(keep + dims).reshape(-1, n) if nd else x.reshape(1, 1)
    out = row_sum(rows).reshape([x.shape[d] for d in keep])
    if keepdim:
        out = out.reshape([1 if d in dims else x.shape[d] for d in range(nd)])
    return out


def _reduced_shape(x: torch.Tensor, dims: list[int], keepdim: bool) -> list[int]:
    return [1 if d in dims else n for d, n in enumerate(x.shape) if keepdim or d not in dims]


def _sum_dtype(x: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    return x.dtype if x.dtype.is_floating_point or x.dtype.is_complex else torch.int64


def sum_dim(self: torch.Tensor, dim: Sequence[int] | None, keepdim: bool = False, *,
            dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten ``sum.dim_IntList``: each output element is one row's fixed-order sum
    (integer and complex tensors: the native kernel)."""
    dims = _reduce_dims(self, dim)
    out_dtype = _sum_dtype(self, dtype)
    if _native(self) or not out_dtype.is_floating_point:
        out = self.new_empty(_reduced_shape(self, dims, keepdim), dtype=out_dtype)
        return aten.sum.IntList_out(self, dims, keepdim, dtype=dtype, out=out)
    ct = _compute_dtype(out_dtype)
    return _sum_over(self.to(ct), dims, keepdim).to(out_dtype)


def sum_all(self: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten ``sum``: every element, as one row."""
    return sum_dim(self, None, False, dtype=dtype)


def mean_dim(self: torch.Tensor, dim: Sequence[int] | None, keepdim: bool = False, *,
             dtype: torch.dtype | None = None) -> torch.Tensor:
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
    ct = _compute_dtype(out_dtype)
    return (_sum_over(self.to(ct), dims, keepdim) / n).to(out_dtype)


def mean_all(self: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten ``mean``: every element, as one row."""
    return mean_dim(self, None, False, dtype=dtype)


# -- pointwise ----------------------------------------------------------------------------

def pointwise(out_op: Callable[..., torch.Tensor], x: torch.Tensor, *args: Any,
              **kwargs: Any) -> torch.Tensor:
    """``out_op(x, *args, out=..., **kwargs)`` with every element on the vector path.

    ``out_op`` is an elementwise aten ``.out`` overload (``aten.silu.out``). The result
    is contiguous, shaped and typed like ``x``.
    """
    n = x.numel()
    if x.is_contiguous() and n % PAD == 0:
        if n <= BLOCK:
            return out_op(x, *args, out=torch.empty_like(x), **kwargs)
        buf, npad = x.view(-1), n
    else:
        npad = -(-n // PAD) * PAD
        buf = x.new_zeros((npad,))
        buf[:n].copy_(x.reshape(-1))
    out = torch.empty((npad,), dtype=x.dtype, device=x.device)
    for s in range(0, npad, BLOCK):
        out_op(buf[s: s + BLOCK], *args, out=out[s: s + BLOCK], **kwargs)
    return out[:n].view(x.shape)


def _unary(out_op: Callable[..., torch.Tensor], native: Callable[..., torch.Tensor]):
    def impl(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if _native(self):
            return out_op(self, *args, out=native(self, *args, **kwargs), **kwargs)
        return pointwise(out_op, self, *args, **kwargs)
    impl.__name__ = out_op.__name__.split(".")[0]
    impl.__doc__ = (f"aten ``{impl.__name__}``: elementwise, every element computed by the "
                    f"vector loop (see :func:`pointwise`).")
    return impl


def _like(self: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
    return torch.empty_like(self)


def _float_like(self: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
    """Output of a unary float op: integers and bools promote to the default dtype."""
    if self.dtype.is_floating_point or self.dtype.is_complex:
        return torch.empty_like(self)
    return torch.empty_like(self, dtype=torch.get_default_dtype())


silu = _unary(aten.silu.out, _like)
sigmoid = _unary(aten.sigmoid.out, _float_like)
gelu = _unary(aten.gelu.out, _like)
tanh = _unary(aten.tanh.out, _float_like)
exp = _unary(aten.exp.out, _float_like)
log = _unary(aten.log.out, _float_like)
cos = _unary(aten.cos.out, _float_like)
sin = _unary(aten.sin.out, _float_like)
rsqrt = _unary(aten.rsqrt.out, _float_like)


def pow_scalar(self: torch.Tensor, exponent: Any) -> torch.Tensor:
    """aten ``pow.Tensor_Scalar``: elementwise on the vector path."""
    if _native(self):
        return torch.ops.aten.pow.Tensor_Scalar_out(
            self, exponent, out=torch.empty_like(self, dtype=torch.result_type(self, exponent)))
    return pointwise(aten.pow.Tensor_Scalar_out, self, exponent)


# -- softmax and normalisation ------------------------------------------------------------

def _rows_last(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    moved = x.movedim(dim, -1)
    return moved.reshape(-1, moved.shape[-1]) if x.dim() else x.reshape(1, 1), moved.shape


def _softmax_like(x: torch.Tensor, dim: int, half_to_float: bool, log_: bool) -> torch.Tensor:
    out_dtype = torch.float32 if half_to_float else x.dtype
    if x.numel() == 0:
        return torch.empty_like(x, dtype=out_dtype)
    dim = dim % x.dim() if x.dim() else 0
    rows, moved_shape = _rows_last(x.to(_compute_dtype(x.dtype)), dim)
    z = rows - rows.amax(dim=1, keepdim=True)          # max is exact: order-free
    e = pointwise(aten.exp.out, z)
    s = row_sum(e).unsqueeze(1)
    y = z - pointwise(aten.log.out, s) if log_ else e / s
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


def native_layer_norm(input: torch.Tensor, normalized_shape: Sequence[int],
                      weight: torch.Tensor | None, bias: torch.Tensor | None,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aten ``native_layer_norm -> (out, mean, rstd)``: two-pass mean and variance by
    :func:`row_sum`, per row of the trailing ``normalized_shape``."""
    k = len(normalized_shape)
    if tuple(input.shape[input.dim() - k:]) != tuple(normalized_shape):
        raise RuntimeError(f"normalized_shape {tuple(normalized_shape)} does not match the "
                           f"trailing dims of input {tuple(input.shape)}")
    n = 1
    for s in normalized_shape:
        n *= s
    ct = _compute_dtype(input.dtype)
    x = input.to(ct).reshape(-1, n)
    mean = (row_sum(x) / n).unsqueeze(1)
    xc = x - mean
    var = (row_sum(xc * xc) / n).unsqueeze(1)
    rstd = pointwise(aten.rsqrt.out, var + eps)
    out = xc * rstd
    if weight is not None:
        out = out * weight.to(ct).reshape(1, n)
    if bias is not None:
        out = out + bias.to(ct).reshape(1, n)
    stat_shape = tuple(input.shape[: input.dim() - k]) + (1,) * k
    return (out.reshape(input.shape).to(input.dtype), mean.reshape(stat_shape),
            rstd.reshape(stat_shape))
