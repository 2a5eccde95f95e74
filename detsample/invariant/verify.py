"""On-machine verification: the properties the fast kernels rest on, checked where they run.

The verified (non-portable) kernels of the mode lean on torch's and MKL's kernels, whose
choices depend on the CPU, ``MKL_ENABLE_INSTRUCTIONS``, the thread count and the operands'
shapes and layouts. None of that is assumed: at the first use of each key, the property
the kernel needs is checked on this machine with random data, and the decision is kept
in the plan registry (:mod:`detsample.invariant.state`):

``matmul_plan(kind, k, n, layout, dtype, threads)``
    a row of a tiled product (:mod:`detsample.invariant.tiles`) has the same bits in every
    tile size of a ladder, at every position of a tile, next to random or zero neighbours,
    and (``bmm``) in a batch of 1, 3 or 8 matrices, at this thread count as at 1 thread.
    Tried: ``B`` in its own layout and (for a transposed ``B``) as a contiguous copy; the
    passing ladder of least estimated cost wins. None passes: the portable fixed-point
    product (:mod:`detsample.invariant.fixedpoint`), with a warning.
``sum_plan(n, dtype, threads)``
    a row summed by torch's ``sum`` alone, or in calls of 2, 3 or many rows (at any
    position), or at 1 thread, has the same bits. Else: the fixed tree
    (:mod:`detsample.invariant.tree`), with a warning.
``pointwise_plan(op, dtype, threads, args)``
    an element's bits under :func:`detsample.ops.vector.pointwise` do not depend on
    its position, the buffer's length or the thread count. Else: the op is refused
    (:class:`NotInvariantError`), or, where one exists, a fallback is named by the caller.

Every check compares bits (``torch.equal``); its random data are seeded by the key, so a
decision is reproducible. A plan records what it rests on and why
(:class:`~detsample.invariant.state.Plan`); ``detsample probe model`` lists them.
"""

from __future__ import annotations

import warnings
import zlib
from typing import Any, Callable, Sequence

import torch

from detsample.errors import DetsampleError
from detsample.invariant import tiles
from detsample.invariant.state import ARITHMETIC, VERIFIED, Plan, plans
from detsample.ops.vector import PAD, pointwise
from detsample.threads import torch_threads

aten = torch.ops.aten

SUM_CHUNK = 8192          # widest row summed by one torch call (longer rows: chunks, then again)
SUM_GRAIN = 32768         # torch's GRAIN_SIZE: calls below it run one serial loop
BATCHES = (1, 3, 8)       # bmm batch sizes compared


class NotInvariantError(DetsampleError, RuntimeError):
    """An op the mode needs is not invariant on this machine and has no fallback."""


class FallbackWarning(UserWarning):
    """A verified kernel failed its check here; the mode took a constructed one."""


def _gen(key: tuple) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _values(shape: Sequence[int], g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Normal values with row magnitudes spread over 2**-6 .. 2**6."""
    x = torch.randn(tuple(shape), generator=g, dtype=torch.float64)
    scale = torch.exp2(torch.randint(-6, 7, tuple(shape[:-1]) + (1,), generator=g).to(torch.float64))
    return (x * scale).to(dtype)


# -- matmul --------------------------------------------------------------------------------

def _layout(b: torch.Tensor) -> str:
    """``"nn"`` (rows of B contiguous), ``"nt"`` (B a transposed contiguous matrix) or
    ``"other"`` (anything else: the kernel makes it contiguous)."""
    st = b.stride()[-2:]
    k, n = b.shape[-2:]
    if st[1] == 1 and (st[0] == n or k <= 1):
        return "nn"
    if st[0] == 1 and (st[1] == k or n <= 1):
        return "nt"
    return "other"


def layout(b: torch.Tensor) -> str:
    """B's layout class as the plans key it (see :func:`matmul_plan`)."""
    lay = _layout(b)
    return "nn" if lay == "other" else lay


def _run(a: torch.Tensor, b: torch.Tensor, size: int) -> torch.Tensor:
    """``a``'s rows (at most ``size``) in ONE tile of ``size`` rows."""
    return tiles.run(a, b, (size,))


def _matmul_candidate(a: torch.Tensor, b: torch.Tensor, nbs: Sequence[int],
                      threads: int) -> tuple[tuple[int, ...] | None, str]:
    """(the best ladder that passes, or None; why) for operands ``a`` ``(nb, 2*TILE, K)``
    and ``b`` ``(nb, K, N)`` (``nbs == (1,)``: a 2-D ``mm``).

    A tile size is *valid* when its rows at this thread count equal its rows at 1 thread
    (each matrix alone), and a row keeps its bits at another position among fresh rows
    and alone among zeros. Valid sizes whose rows agree with each other form a ladder;
    the cheapest ladder (:func:`~detsample.invariant.tiles.ladder_cost`) whose largest
    tile also keeps a column's bits when the other columns of B change (the attention's
    future keys) wins."""
    T = tiles.TILE
    two_d = nbs == (1,)

    def sub(x: torch.Tensor, nb: int) -> torch.Tensor:
        return x[0] if two_d else x[:nb]

    def alone(x: torch.Tensor, i: int) -> torch.Tensor:
        return x[i] if two_d else x[i: i + 1]

    with torch_threads(1):   # each matrix alone, at 1 thread: the bits every call must give
        refs = {s: [_run(alone(a, i)[..., :s, :], alone(b, i), s) for i in range(max(nbs))]
                for s in tiles.SIZES}
    ref = {(nb, s): refs[s][0] if two_d else torch.cat(refs[s][:nb]) for nb in nbs for s in tiles.SIZES}
    bad: dict[int, str] = {}
    for s in tiles.SIZES:
        for nb in nbs:
            aa, bb, want = sub(a, nb), sub(b, nb), ref[(nb, s)]
            if not torch.equal(_run(aa[..., :s, :], bb, s), want):
                bad[s] = (f"{threads} thread(s) differ from 1 thread"
                          + ("" if two_d else f" or {nb} matrices from one"))
                break
            mixed = aa[..., T: T + s, :].clone()
            mixed[..., 1::2, :] = aa[..., :s, :].flip(-2)[..., 1::2, :]
            if not torch.equal(_run(mixed, bb, s)[..., 1::2, :], want.flip(-2)[..., 1::2, :]):
                bad[s] = "a row's bits depend on its position or neighbours"
                break
            lone = torch.zeros_like(aa[..., :s, :])
            lone[..., s - 1, :] = aa[..., 0, :]
            if not torch.equal(_run(lone, bb, s)[..., s - 1: s, :], want[..., :1, :]):
                bad[s] = "a row's bits depend on zero neighbours"
                break
    valid = [s for s in tiles.SIZES if s not in bad]
    ladders: list[list[int]] = []
    for s in reversed(valid):            # group sizes whose rows agree (largest first)
        for lad in ladders:
            if all(torch.equal(ref[(nb, s)], ref[(nb, lad[0])][..., :s, :]) for nb in nbs):
                lad.insert(0, s)
                break
        else:
            ladders.append([s])
    why = "; ".join(f"{s} rows: {w}" for s, w in sorted(bad.items()))
    for lad in sorted(ladders, key=lambda lad: tiles.ladder_cost(tuple(lad))):
        top = lad[-1]
        ok = True
        for nb in nbs:
            aa, bb, want = sub(a, nb), sub(b, nb), ref[(nb, top)]
            other = bb.flip(-1) * 0.5
            other[..., :1] = bb[..., :1]
            if not torch.equal(_run(aa[..., :top, :], _like_layout(other, bb), top)[..., :1],
                               want[..., :1]):
                ok = False
                why = (why + "; " if why else "") + f"{top} rows: a column depends on the other columns"
                break
        if ok:
            sizes = "/".join(map(str, lad))
            return tuple(lad), f"rows agree in tiles of {sizes}" + (f" (not: {why})" if why else "")
    return None, why or "no tile size passed"


def _like_layout(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` copied into the memory layout of ``like`` (a transposed matrix)."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2) if _layout(like) == "nt" else x.contiguous()


def _decide_matmul(kind: str, k: int, n: int, lay: str, dtype: torch.dtype,
                   threads: int) -> Plan:
    key = (kind, k, n, lay, dtype, threads)
    g = _gen(key)
    nbs = (1,) if kind == "mm" else BATCHES
    nb = max(nbs)
    a = _values((nb, 2 * tiles.TILE, k), g, dtype)
    w = _values((nb, n, k), g, dtype)
    b = w.transpose(1, 2) if lay == "nt" else w.transpose(1, 2).contiguous()
    tried = []
    best: tuple[int, str, str] | None = None
    for form in ("native", "contiguous") if lay == "nt" else ("native",):
        bb = b if form == "native" else b.contiguous()
        ladder, why = _matmul_candidate(a, bb, nbs, threads)
        tried.append(f"{form} layout: {why}")
        if ladder is not None and (best is None or tiles.ladder_cost(ladder) < tiles.ladder_cost(best[0])):
            best = (ladder, form, why)
    if best is not None:
        ladder, form, why = best
        return Plan(f"torch/BLAS {kind} in row tiles of {'/'.join(map(str, ladder))}, {form} B", VERIFIED,
                    f"{why} ({'; '.join(tried)})", (form, ladder))
    reason = "; ".join(tried)
    warnings.warn(f"batch-invariant mode: {kind} with K={k}, N={n} ({lay} B, {dtype}, {threads} "
                  f"threads) is not invariant on this machine's BLAS ({reason}); it takes the "
                  f"portable fixed-point product instead", FallbackWarning, stacklevel=4)
    return Plan("portable fixed-point product", ARITHMETIC, f"BLAS check failed: {reason}")


def matmul_plan(kind: str, k: int, n: int, lay: str, dtype: torch.dtype) -> Plan:
    """The plan of a product (``kind`` "mm" or "bmm") with ``K = k`` and a column block of
    ``n`` columns, B of layout ``lay`` ("nn" / "nt"), in compute dtype ``dtype``, at the
    current thread count."""
    threads = torch.get_num_threads()
    key = ("matmul", kind, k, n, lay, dtype, threads)
    return plans().get(key, lambda: _decide_matmul(kind, k, n, lay, dtype, threads))


# -- reductions ----------------------------------------------------------------------------

def torch_row_sum(x: torch.Tensor) -> torch.Tensor:
    """Row sums of ``(R, n)`` (``n <= SUM_CHUNK``) by torch's ``sum``, in calls of fewer
    than SUM_GRAIN elements (one serial loop each)."""
    r, n = x.shape
    out = x.new_empty((r,))
    step = max(1, (SUM_GRAIN - 1) // max(n, 1))
    for s in range(0, r, step):
        aten.sum.IntList_out(x[s: s + step], [1], out=out[s: s + step])
    return out


def _decide_sum(n: int, dtype: torch.dtype, threads: int) -> Plan:
    key = ("sum", n, dtype, threads)
    g = _gen(key)
    step = max(1, (SUM_GRAIN - 1) // max(n, 1))
    rows = min(max(step, 4), 64)
    x = _values((rows, n), g, dtype)
    with torch_threads(1):
        alone = torch.cat([torch_row_sum(x[i: i + 1]) for i in range(rows)])
    for count in sorted({2, 3, rows}):
        for start in (0, rows - count):
            got = torch_row_sum(x[start: start + count].contiguous())
            if not torch.equal(got, alone[start: start + count]):
                reason = (f"a row summed among {count} rows differs from the row alone "
                          f"({n} columns, {threads} threads)")
                warnings.warn(f"batch-invariant mode: torch's sum is not row-invariant here "
                              f"({reason}); rows take the fixed-tree sum", FallbackWarning,
                              stacklevel=4)
                return Plan("fixed-tree sum", ARITHMETIC, f"torch's sum check failed: {reason}")
    return Plan("torch sum (serial vector loop per call)", VERIFIED,
                f"rows agree alone and in calls of 2, 3 and {rows} rows, at {threads} and 1 threads")


def sum_plan(n: int, dtype: torch.dtype) -> Plan:
    """The plan of a row sum of ``n <= SUM_CHUNK`` columns in ``dtype``."""
    threads = torch.get_num_threads()
    return plans().get(("sum", n, dtype, threads), lambda: _decide_sum(n, dtype, threads))


# -- pointwise -----------------------------------------------------------------------------

_SPECIALS = (0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 88.0, -88.0, 20.0, -20.0)


def _decide_pointwise(name: str, out_op: Callable[..., torch.Tensor], dtype: torch.dtype,
                      args: tuple, kwargs: tuple, threads: int,
                      domain: Callable[[torch.Tensor], torch.Tensor]) -> Plan:
    g = _gen(("pointwise", name, dtype, args, kwargs, threads))
    x = domain(torch.cat([torch.randn(4096 - len(_SPECIALS), generator=g, dtype=torch.float64) * 8,
                          torch.tensor(_SPECIALS, dtype=torch.float64)])).to(dtype)
    kw = dict(kwargs)
    with torch_threads(1):
        ref = pointwise(out_op, x, *args, **kw)
    checks = [("the whole buffer", x, 0)]
    for shift in (1, 7, 16, 33):
        checks.append((f"shifted by {shift}", torch.cat([x[-shift:], x[:-shift]]), shift))
    for label, y, shift in checks:
        got = pointwise(out_op, y, *args, **kw)
        if not torch.equal(torch.cat([got[shift:], got[:shift]]), ref):
            return _refuse(name, dtype, threads, f"an element's bits depend on its position ({label})")
    small = pointwise(out_op, x[:PAD].clone(), *args, **kw)
    if not torch.equal(small, ref[:PAD]):
        return _refuse(name, dtype, threads, f"a {PAD}-element buffer differs from a 4096-element one")
    return Plan(f"torch {name} on the vector loop", VERIFIED,
                f"elements agree at 5 positions, 2 buffer lengths, {threads} and 1 threads")


def _refuse(name: str, dtype: torch.dtype, threads: int, why: str) -> Plan:
    return Plan("refused", VERIFIED, f"{name} ({dtype}, {threads} threads): {why}")


def pointwise_plan(name: str, out_op: Callable[..., torch.Tensor], dtype: torch.dtype,
                   args: tuple = (), kwargs: dict[str, Any] | None = None,
                   domain: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> Plan:
    """The plan of elementwise op ``name`` (its ``.out`` overload ``out_op``) in ``dtype``
    with extra arguments ``args`` / ``kwargs``; ``domain`` maps test values into the op's
    domain. A ``"refused"`` plan: the caller raises :class:`NotInvariantError` or takes a
    fallback."""
    threads = torch.get_num_threads()
    kw = tuple(sorted((kwargs or {}).items()))
    key = ("pointwise", name, dtype, args, kw, threads)
    return plans().get(key, lambda: _decide_pointwise(name, out_op, dtype, args, kw, threads, domain))
