"""The mode's matrix products: verified BLAS tiles, or the portable correctly rounded product.

:func:`product` is what every matmul-family kernel of the mode (``mm``, ``addmm``,
``bmm``, ``baddbmm``, ``mv``, ``dot``) and the invariant attention compute with:

* ``portable=True``: :func:`detsample.invariant.exact.matmul`, every element the float32
  nearest to the exact dot product (any CPU, BLAS path, thread count, K split);
* ``portable=False``: ``B``'s columns in blocks (:func:`~detsample.invariant.tiles.col_blocks`),
  each block with the plan the on-machine verification gave it
  (:func:`~detsample.invariant.verify.matmul_plan`): row tiles of the verified ladder, ``B``
  in its own layout or as a contiguous copy, at the process's thread count or at 1 thread
  (a BLAS that splits K across threads), or, where the BLAS failed its check, the portable
  product for that block.

Either way a row's bits depend on that row of ``A`` and on ``B`` only. Reduced-precision
operands (bfloat16, float16) are computed in float32; the result is in the compute dtype
(float32, or float64 for float64 operands) and the caller rounds once.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from detsample.invariant import exact, tiles
from detsample.invariant.state import Plan, note_portable
from detsample.invariant.verify import big_plan, layout, matmul_plan
from detsample.invariant.weights import cache_owner, derived, owner
from detsample.probe.threads import torch_threads

_REDUCED = (torch.bfloat16, torch.float16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for reduced precision, else the dtype itself."""
    return torch.float32 if dtype in _REDUCED else dtype


def _as(t: torch.Tensor, ct: torch.dtype, of: torch.Tensor | None) -> torch.Tensor:
    if t.dtype == ct:
        return t
    return derived(t, f"as-{ct}", lambda x: x.to(ct), of)


def _contiguous(t: torch.Tensor, of: torch.Tensor | None) -> torch.Tensor:
    return t if t.is_contiguous() else derived(t, "contiguous", lambda x: x.contiguous(), of)


def _portable(a: torch.Tensor, b: torch.Tensor, keyed: bool, of: torch.Tensor | None) -> torch.Tensor:
    if keyed:
        return exact.weighted_sum(a, b)
    if cache_owner(b, of) is None:  # an activation (the attention's keys): matmul picks its form
        return exact.matmul(a, b)
    return exact.matmul(a, b, derived(b, "exact", exact.prepare_b, of))


def product(
    a: torch.Tensor, b: torch.Tensor, portable: bool, keyed: bool = False, of: torch.Tensor | None = None
) -> torch.Tensor:
    """``a @ b``: ``(M, K) x (K, N)`` or batched ``(nb, M, K) x (nb, K, N)``, floating, on
    CPU, in the compute dtype (see the module docstring). Guarantee: row ``i`` of the
    result is a function of ``a``'s row ``i`` and ``b`` (bitwise); with ``portable``, of
    the values alone. ``keyed``: ``a`` weighs the rows of ``b`` and a zero weight must
    leave a result row unchanged whatever that row of ``b`` holds (the attention's value
    product): the portable form then scales ``b`` per row
    (:func:`~detsample.invariant.exact.weighted_sum`). ``of``: the parameter ``b`` is
    a slice of when ``b`` was cut inside a kernel (its derived forms are then cached)."""
    ct = compute_dtype(a.dtype)
    a = a.to(ct) if a.dtype != ct else a
    of = of if of is not None else owner(b)
    b = _as(b, ct, of)
    kind = "bmm" if a.dim() == 3 else "mm"
    if portable:
        note_portable(
            ("matmul", kind, a.shape[-1], b.shape[-1], "keyed" if keyed else "any", ct, "portable"),
            "portable correctly rounded product",
        )
        return _portable(a, b, keyed, of).to(ct)
    lay = layout(b)
    if lay == "nn" and not b.is_contiguous():
        b = _contiguous(b, of)
    k, blocks = a.shape[-1], tiles.col_blocks(b.shape[-1])
    parts = []
    for c0, c1 in blocks:
        bb = b[..., c0:c1] if len(blocks) > 1 else b
        if lay == "nn" and len(blocks) > 1:
            bb = _contiguous(bb, of)
        plan = matmul_plan(kind, k, c1 - c0, lay, ct)
        if plan.portable:
            parts.append(_portable(a, bb, keyed, of).to(ct))
            continue
        bb = _contiguous(bb, of) if plan.data[0] == "contiguous" else bb
        big = big_plan(k, c1 - c0, lay, ct, plan).data if kind == "mm" and a.shape[0] >= tiles.BIG[0] else ()
        parts.append(_tiled(a, bb, plan, big))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def _tiled(a: torch.Tensor, b: torch.Tensor, plan: Plan, big: tuple[int, ...]) -> torch.Tensor:
    """``a @ b`` by a verified plan: the leading rows in the qualifying ``big`` tiles (at
    this thread count), the rest in the ladder's tiles (at 1 thread where the plan says)."""
    _, ladder, single = plan.data
    if not big and not single:  # a decode step's products: the ladder alone
        return tiles.run(a, b, ladder)
    sizes, rest = tiles.big_split(a.shape[-2], big)
    head = a.shape[-2] - rest
    out = [tiles.run_sizes(a[:head], b, sizes)] if sizes else []
    if rest:
        with torch_threads(1) if single else nullcontext():
            out.append(tiles.run(a[head:] if head else a, b, ladder))
    return out[0] if len(out) == 1 else torch.cat(out)
