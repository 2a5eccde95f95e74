"""Portable products: every element the float32 nearest to the exact dot product.

The definition (``oracles/invariant.py`` spells it per element, with exact rationals):

* ``C[m, n] = RN32(S)`` with ``S = sum_k A[m, k] * B[k, n]`` computed **exactly** from the
  float32 values (bfloat16 / float16 upcast exactly) and rounded **once** to float32 (to
  nearest, ties to even); an exact zero gives ``+0.0``.
* ``matmul``: NaN where a row of ``A`` or a column of ``B`` holds a non-finite value;
  ``weighted_sum``: NaN in a row that holds a non-finite weight or gives a non-zero weight
  to a key (row of ``v``) with a non-finite value.

A real number has one nearest float32, so the bits depend on the values alone: no BLAS
kernel, thread count, CPU, order or split of K (across calls, chunks or tensor-parallel
ranks) can change them. And no float32 is closer to the exact product: every element is
within half a float32 ulp of it, as accurate as a float32 result can be -- at least as
accurate as any float32 GEMM, element by element, on every input (rows with massive
activations, one channel 10^4 x the rest, included).

How it is computed, in three stages, each exact in what it decides:

1. ``D``, the float64 GEMM of the float32 values (each product is exact in float64),
   one BLAS call per 256-long K-chunk, the chunks' results added in order by detsample.
   In whatever order a BLAS sums inside a call, a product goes through at most
   ``n = min(K, 256) + ceil(K / 256)`` additions, so
   ``|D - S| <= gamma(n) * sum_k |a b|`` (the textbook bound of a summation tree of
   depth ``n``), with ``gamma(n) = (n + 2) * 2**-52`` (twice the textbook constant: it
   covers the rounding of the bound's own arithmetic) and ``sum_k |a b|`` bounded by
   Cauchy-Schwarz over 32-long K-blocks (block norms computed as upper bounds).
   Where ``D - E`` and ``D + E`` round to the same float32 (bit for bit), ``S`` -- between
   them -- rounds to it too: that is ``C``. Measured: all but ~10^-4 .. 10^-3 of the
   elements of Gaussian products.
2. The others: their ``K`` products (exact) summed pairwise by TwoSum, which is error
   free; the errors summed and bounded: ``S`` to ~2^-100 relative; the same test.
3. What still straddles a rounding boundary (``S`` on a float32 midpoint, or within
   ~2^-50 of one): ``math.fsum`` (the correctly rounded float64 of the exact sum) and, at a
   float32 midpoint, the sign of the exact residual (fsum again) decides.

Cost: the float64 GEMM (about twice a float32 one) and a few passes over the output;
stages 2 and 3 touch few elements. This replaces a fixed-point product (21 bits per row
of ``A``), whose error on a row with a 3000x channel was 1800x that of float32 BLAS.

Where numba runs (CPU tensors), the operands' preparation, stage 1 and stages 2-3 are
numba kernels (:mod:`detsample.invariant.exact_jit`: one pass each, stage 2 as TwoSum in
order; no operator call per element or per tree level): the torch stages below are the
form where it does not, and the two give the same bits -- each decides only what the
definition decides (tests/invariant/test_exact.py holds them to each other). A decode
step's product of 8 rows went from ~2.0 to ~0.7 ms with them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from detsample.arith.cpu import rows_view, split_rows

aten = torch.ops.aten

_ULP = 2.0**-52  # float64 machine epsilon (twice the unit roundoff)
_GATHER = 1 << 22  # products gathered per chunk in stages 2 and 3


def gamma(k: int) -> float:
    """The float64 error constant of a ``k``-term dot product (2x the textbook
    ``k u / (1 - k u)``, ``u = 2**-53``): ``|D - S| <= gamma(k) * ||a|| * ||b||``."""
    return (k + 2) * _ULP


BLOCK = 32  # K-block of the norm bound (see :func:`prepare`)


@dataclass(frozen=True)
class Operand:
    """One operand ready for :func:`matmul`: ``values`` (float64, non-finite entries set
    to 0; None for a B prepared by :func:`prepare_norms`), ``blocks`` (float64 upper
    bounds of the Euclidean norm of each :data:`BLOCK`-long K-block of each row of A --
    ``(..., M, nblk)`` -- or column of B -- ``(..., nblk, N)``), ``bad`` (bool, slices
    along K that held a non-finite value, kept; or None)."""

    values: torch.Tensor | None
    blocks: torch.Tensor
    bad: torch.Tensor | None
    dim: int


def inflation(terms: int) -> float:
    """``1 + (terms + 4) * 2**-52``: a computed float64 sum of ``terms`` non-negative
    terms (any order) times this is an upper bound of the exact sum."""
    return 1.0 + (terms + 4) * _ULP


def inflate(x: torch.Tensor, terms: int) -> torch.Tensor:
    """``x`` (float64, a computed sum of ``terms`` non-negative terms, any order), in
    place, times :func:`inflation`: an upper bound of the exact sum."""
    return x.mul_(inflation(terms))


@functools.cache
def _kernels():
    """The numba kernels (:mod:`detsample.invariant.exact_jit`), or None without numba."""
    try:
        from detsample.invariant import exact_jit
    except ImportError:
        return None
    return exact_jit


def _jit_for(*tensors: torch.Tensor):
    """The numba kernels where they can run on ``tensors`` (CPU), else None: the torch
    stages then decide (the same bits: both compute the definition)."""
    k = _kernels()
    return k if k is not None and all(t.device.type == "cpu" for t in tensors) else None


def _jit_for_operand(x: torch.Tensor):
    """:func:`_jit_for` an operand the preparation kernels take: a float32 CPU matrix
    (or batch of them) with no empty dimension of its own, else None."""
    if x.dtype != torch.float32 or x.dim() < 2 or x.shape[-1] == 0 or x.shape[-2] == 0:
        return None
    return _jit_for(x)


def prepare(x: torch.Tensor, dim: int) -> Operand:
    """``x`` (float32 / bfloat16 / float16, any leading dims) as an :class:`Operand`
    along ``dim`` (-1: rows of A; -2: columns of B). Exact: float64 holds every value.
    The block norms bound ``sum_k |a_k b_k|`` by ``sum_blocks ||a_blk|| ||b_blk||``
    (Cauchy-Schwarz per block): a massive channel loosens its own block only."""
    jit = _jit_for_operand(x)
    if jit is not None:
        if dim in (-1, x.dim() - 1):
            return _prepare_rows(jit, x)
        if dim in (-2, x.dim() - 2):
            if x.stride(-2) == 1 and x.stride(-1) != 1:  # columns laid out as rows
                rows = _prepare_rows(jit, x.mT)
                bad = None if rows.bad is None else rows.bad.mT
                return Operand(rows.values.mT, rows.blocks.mT, bad, -2)
            return _prepare_cols(jit, x)[0]
    xd = x.to(torch.float64)
    bad = None
    if not bool(torch.isfinite(x).all()):
        finite = torch.isfinite(xd)
        bad = ~finite.all(dim=dim, keepdim=True)
        xd = torch.where(finite, xd, 0.0)
    sq = (xd * xd).movedim(dim, -1)
    k = sq.shape[-1]
    nblk = max(1, -(-k // BLOCK))
    if k != nblk * BLOCK:
        sq = torch.nn.functional.pad(sq, (0, nblk * BLOCK - k))
    blocks = inflate(sq.reshape(sq.shape[:-1] + (nblk, BLOCK)).sum(dim=-1), BLOCK)
    blocks = blocks.sqrt_().mul_(1.0 + 4 * _ULP).movedim(-1, dim).contiguous()
    return Operand(xd, blocks, bad, dim)


def _prepare_rows(jit, x: torch.Tensor, store: bool = True) -> Operand | None:
    """:func:`prepare` of a float32 CPU ``x (..., M, K)`` along its rows, in one numba pass
    (the torch form's finiteness check, conversion, squares and block sums are ~8
    passes), reading ``x`` in its own strides. ``store`` False: the block norms and flags
    alone (``values`` None: :func:`prepare_norms`), or None where ``x``'s matrices are
    not each contiguous."""
    lead, (m, k) = tuple(x.shape[:-2]), tuple(x.shape[-2:])
    mats = _matrices(x.detach(), m, k)
    dense = _dense(mats)
    if dense is None and not store:
        return None
    nb, nblk = mats.shape[0], -(-k // BLOCK)
    values = np.empty((nb, m, k), np.float64) if store else None
    blocks = np.empty((nb, m, nblk), np.float64)
    bad = np.empty((nb, m), np.bool_)
    pre, post = inflation(BLOCK), 1.0 + 4 * _ULP
    counts = []

    def run(s: int, e: int) -> None:
        if dense is None:
            counts.append(jit.prepare_rows(mats, BLOCK, pre, post, values, blocks, bad, s, e))
        else:
            flat = None if values is None else values.reshape(-1)
            counts.append(jit.prepare_rows_dense(*dense, (m, k), BLOCK, pre, post, flat, blocks, bad, s, e))

    split_rows(run, nb * m, nb * m * k)
    shape = lead + (m,)
    flags = torch.from_numpy(bad).view(shape + (1,)) if sum(counts) else None
    kept = None if values is None else torch.from_numpy(values).view(x.shape)
    return Operand(kept, torch.from_numpy(blocks).view(shape + (nblk,)), flags, -1)


def prepare_norms(b: torch.Tensor) -> Operand | None:
    """The B operand ``(..., K, N)`` for :func:`_decode_first_pass` alone: its columns'
    block norm bounds and non-finite flags, no float64 values (the decode kernel reads
    ``b`` itself, stages 2 and 3 its float32 values: a product of two float32 is exact in
    float64). None where the columns are not laid out as contiguous rows."""
    jit = _jit_for_operand(b)
    if jit is None or b.stride(-2) != 1:
        return None
    rows = _prepare_rows(jit, b.mT, store=False)
    if rows is None:
        return None
    bad = None if rows.bad is None else rows.bad.mT
    return Operand(None, rows.blocks.mT, bad, -2)


def _matrices(x: torch.Tensor, m: int, k: int) -> np.ndarray:
    """``x (..., m, k)`` as a numpy ``(nb, m, k)`` array in its own strides where numpy
    can reshape it so (a copy otherwise)."""
    return x.numpy().reshape((-1, m, k))


def _dense(mats: np.ndarray) -> tuple[np.ndarray, int] | None:
    """``(flat, stride)`` where every matrix of float32 ``mats (nb, m, k)`` is contiguous
    (a contiguous batch, or slices of one, as the attention's key blocks are): a flat
    view of the buffer from the first matrix to the end of the last, and the elements
    from one matrix to the next -- the operands the vectorised ``*_dense`` kernels read.
    None otherwise (the kernels that read any strides)."""
    nb, m, k = mats.shape
    if mats.flags.c_contiguous:
        return mats.reshape(-1), m * k
    size, step = mats.itemsize, mats.strides[0]
    if not mats[0].flags.c_contiguous or step % size or step < 0:
        return None
    stride = step // size
    return np.lib.stride_tricks.as_strided(mats, shape=((nb - 1) * stride + m * k,), strides=(size,)), stride


def _prepare_cols(jit, x: torch.Tensor) -> tuple[Operand, torch.Tensor | None]:
    """:func:`prepare` of a float32 CPU ``x (..., K, N)`` along K (per column) in one
    numba pass, and the keys (rows of ``x``) holding a non-finite value (``(..., K, 1)``
    bool, or None where every value is finite): :func:`weighted_sum`'s rule."""
    lead, (k, n) = tuple(x.shape[:-2]), tuple(x.shape[-2:])
    mats = _matrices(x.detach(), k, n)
    nb, nblk = mats.shape[0], -(-k // BLOCK)
    values = np.empty(mats.shape, np.float64)
    blocks = np.empty((nb, nblk, n), np.float64)
    col_bad = np.empty((nb, n), np.bool_)
    row_bad = np.empty((nb, k), np.bool_)
    pre, post = inflation(BLOCK), 1.0 + 4 * _ULP
    counts = []
    dense = _dense(mats)

    def run(s: int, e: int) -> None:
        if dense is None:
            counts.append(jit.prepare_cols(mats, BLOCK, pre, post, values, blocks, col_bad, row_bad, s, e))
        else:
            args = (pre, post, values, blocks, col_bad, row_bad, s, e)
            counts.append(jit.prepare_cols_dense(*dense, (k, n), BLOCK, *args))

    split_rows(run, nb, mats.size)
    any_bad = sum(counts) > 0
    cols = torch.from_numpy(col_bad).view(lead + (1, n)) if any_bad else None
    keys = torch.from_numpy(row_bad).view(lead + (k, 1)) if any_bad else None
    fb = Operand(torch.from_numpy(values).view(x.shape), torch.from_numpy(blocks).view(lead + (nblk, n)), cols, -2)
    return fb, keys


def prepare_b(b: torch.Tensor) -> Operand:
    """The B operand (``(..., K, N)``): per column. A weight's form is cached by the mode."""
    return prepare(b, -2)


CHUNK = 256  # K-chunk of the float64 GEMM (see :func:`dot64`)


def depth(k: int) -> int:
    """A bound on the additions any of ``k`` products goes through in :func:`dot64`:
    within its chunk's BLAS call (a sum of at most ``CHUNK`` terms: at most ``CHUNK - 1``
    additions, in whatever order or tree the BLAS takes), then one per later chunk (the
    chunks' results are added by detsample, in order). The error bound of stage 1 is
    ``gamma(depth(k))``: ~10x tighter than ``gamma(k)`` for K in the thousands, so ~10x
    fewer elements reach stage 2."""
    return min(k, CHUNK) + -(-k // CHUNK)


def dot64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` in float64 (2-D or batched): one BLAS call per :data:`CHUNK` columns of
    ``a``, each into its own buffer (``beta = 0``), the chunks' results added in order by
    detsample -- so the additions a product goes through are bounded by :func:`depth`
    whatever the BLAS does inside a call. The ``.out`` overloads, which the mode never
    overrides (this module runs inside the mode's kernels)."""
    k = a.shape[-1]
    mm = aten.mm.out if a.dim() == 2 else aten.bmm.out
    out = a.new_empty(a.shape[:-1] + (b.shape[-1],))
    mm(a[..., :CHUNK], b[..., :CHUNK, :], out=out)
    part = out.new_empty(out.shape) if k > CHUNK else None
    for k0 in range(CHUNK, k, CHUNK):
        mm(a[..., k0 : k0 + CHUNK], b[..., k0 : k0 + CHUNK, :], out=part)
        out.add_(part)
    return out


def magnitude(fa: Operand, fb: Operand) -> torch.Tensor:
    """An upper bound of ``sum_k |a_k b_k|`` for every output element (float64)."""
    return inflate(dot64(fa.blocks, fb.blocks), fa.blocks.shape[-1])


def _rounded(d: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(c, unsettled)``: for ``S`` within ``e`` of ``d`` (float64, both consumed),
    ``c = RN32(S)`` where ``RN32(d - e)`` and ``RN32(d + e)`` have the same bits (rounding
    is monotone), and a mask of where they differ. ``e`` must already cover the rounding
    of ``d - e`` and ``d + e`` themselves (half a float64 ulp of ``|d| + e`` each); ``d``
    is made ``+0.0`` at zero."""
    d = d.add_(0.0)
    hi = torch.add(d, e).to(torch.float32)
    lo = d.sub_(e).to(torch.float32)
    return lo, lo.view(torch.int32) != hi.view(torch.int32)


def _slack(adds: int) -> float:
    """Stage 1's error factor for a sum in which no product goes through more than
    ``adds`` additions: ``|d| <= mag (1 + gamma)``, and three more float64 ulps of ``mag``
    cover rounding ``d -+ e``."""
    return gamma(adds + 3)


def first_pass(d: torch.Tensor, mag: torch.Tensor, adds: int, pre: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1: ``(c, unsettled)`` from ``d`` (a float64 sum of the products in which no
    product goes through more than ``adds`` additions, :func:`depth`; consumed) and
    ``mag`` (:func:`magnitude`, or its product before the factor ``pre`` -- an
    :func:`inflation` -- is applied; consumed). One numba pass where it can run (the
    torch form's seven passes over ``(M, N)`` float64 cost ~12% of a prefill's product)."""
    g = _slack(adds)
    jit = _jit_for(d)
    if jit is None or d.numel() == 0:  # (no element: nothing for a kernel's row view)
        return _rounded(d, (mag if pre == 1.0 else mag.mul_(pre)).mul_(g))
    dd, mm = rows_view(d), rows_view(mag)
    n = dd.shape[1]
    lo = np.empty(dd.size, np.float32)
    flags = np.empty(dd.size, np.bool_)
    fd, fm = dd.reshape(-1), mm.reshape(-1)
    split_rows(lambda s, e: jit.first_pass_flat(fd, fm, pre, g, lo, flags, s * n, e * n), dd.shape[0], dd.size)
    return torch.from_numpy(lo).view(d.shape), torch.from_numpy(flags).view(d.shape)


def _two_sum_tree(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, errors)`` with ``sum(p, dim=1) == s + sum(errors, dim=1)`` exactly: ``p``
    ``(F, K)`` halved until one column is left (column ``j`` plus column ``j + h``), each
    addition's rounding error kept (TwoSum, error free in round-to-nearest)."""
    errs = []
    p = p.contiguous()
    while p.shape[1] > 1:
        if p.shape[1] % 2:
            p = torch.cat([p, p.new_zeros((p.shape[0], 1))], dim=1)
        h = p.shape[1] // 2
        x, y = p[:, :h], p[:, h:]
        s = x + y
        yv = s - x
        errs.append((x - (s - yv)).add_(y - yv))
        p = s
    return p[:, 0], torch.cat(errs, dim=1) if errs else p.new_zeros((p.shape[0], 1))


def _second_pass(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 2 on exact products ``p (F, K)``: ``(c, unsettled)`` as :func:`_rounded`."""
    s, errs = _two_sum_tree(p)
    t = errs.sum(dim=1)
    d = s + t  # not in place: for K = 1, s is a view of p, which stage 3 reads
    bound = errs.abs().sum(dim=1).mul_(gamma(errs.shape[1])).add_(d.abs(), alpha=2 * _ULP)
    return _rounded(d, bound)


def exact_f32(p: list[float]) -> float:
    """Stage 3, for one element: ``RN32(sum(p))`` of exact float64 terms ``p``, exactly
    (``+0.0`` for an exact zero)."""
    s = math.fsum(p)  # RN64 of the exact sum
    c = np.float32(s)
    if float(c) == s:
        return float(c) + 0.0
    other = np.nextafter(c, np.float32(math.copysign(math.inf, s - float(c))))
    if s != (float(c) + float(other)) / 2:  # not a float32 midpoint: RN32(RN64(S)) = RN32(S)
        return float(c)
    r = math.fsum(p + [-s])  # the exact residual's sign
    if r == 0:
        return float(c)  # an exact tie: numpy rounded it to even
    return float(max(c, other)) if r > 0 else float(min(c, other))


def settle(p: torch.Tensor) -> torch.Tensor:
    """``RN32`` of each row sum of the exact products ``p (F, K)`` (float64): stages 2
    and 3. Returns ``(F,)`` float32. By numba where it can run (stage 2 as TwoSum in
    order, :func:`~detsample.invariant.exact_jit.settle_rows`: ~10 us where the torch
    tree takes ~50 operator calls), else by the torch stages; the same bits."""
    jit = _jit_for(p)
    if jit is not None:
        rows = rows_view(p)
        out = np.empty(rows.shape[0], np.float32)
        g, two_ulp = gamma(rows.shape[1]), 2 * _ULP
        split_rows(lambda s, e: jit.settle_rows(rows, g, two_ulp, out, s, e), rows.shape[0], rows.size)
        return torch.from_numpy(out)
    c, left = _second_pass(p)
    for i in torch.nonzero(left).flatten().tolist():
        c[i] = exact_f32(p[i].tolist())
    return c


def settle_at(c: torch.Tensor, unsettled: torch.Tensor, products, k: int) -> torch.Tensor:
    """``c`` with its ``unsettled`` elements settled; ``products(index)`` gives the exact
    ``k`` products ``(F, k)`` of the elements at ``index`` (a tuple of index tensors, as
    ``nonzero(as_tuple=True)``), fetched in chunks of at most ~4M products."""
    if not bool(unsettled.any()):
        return c
    index = torch.nonzero(unsettled, as_tuple=True)
    step = max(1, _GATHER // max(k, 1))
    for lo in range(0, index[0].numel(), step):
        part = tuple(i[lo : lo + step] for i in index)
        c[part] = settle(products(part))
    return c


def pair_products(a: torch.Tensor, b: torch.Tensor):
    """``products(index)`` for :func:`settle_at`: ``a (..., M, K)`` rows times ``b (..., K,
    N)`` columns, exact in float64."""

    def products(index: tuple[torch.Tensor, ...]) -> torch.Tensor:
        *lead, m, n = index
        rows = a[(*lead, m)]
        cols = b[(*lead, slice(None), n)] if lead else b[:, n].t()
        return rows * cols

    return products


def _settle_pairs(c: torch.Tensor, unsettled: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``c`` with its ``unsettled`` elements settled, for ``c = a @ b`` (``a (..., M,
    K)``, ``b (..., K, N)`` float64, exact values): :func:`settle_at` with
    :func:`pair_products`, or one numba kernel that forms each element's products itself
    (no gather of rows and columns; the same bits). ``unsettled`` None: a kernel counted
    none (``c`` as is)."""
    if unsettled is None:
        return c
    jit = _jit_for(c, a, b)
    if jit is None:
        return settle_at(c, unsettled, pair_products(a, b), a.shape[-1])
    index = np.flatnonzero(unsettled.numpy())
    if index.size == 0:
        return c
    k = a.shape[-1]
    a3 = a.detach().numpy().reshape((-1,) + tuple(a.shape[-2:]))
    b3 = b.detach().numpy().reshape((-1,) + tuple(b.shape[-2:]))
    flat = c.numpy().reshape(-1)  # c: stage 1's fresh contiguous result
    g, two_ulp = gamma(k), 2 * _ULP
    split_rows(lambda s, e: jit.settle_pairs(a3, b3, index, g, two_ulp, flat, s, e), index.size, index.size * k)
    return c


def nan_where(c: torch.Tensor, bad: torch.Tensor | None) -> torch.Tensor:
    """``c`` with NaN where ``bad`` (a broadcastable mask, or None: ``c`` as is)."""
    return c if bad is None else c.masked_fill_(bad, float("nan"))


def either(x: torch.Tensor | None, y: torch.Tensor | None) -> torch.Tensor | None:
    if x is None or y is None:
        return y if x is None else x
    return x | y


def _rounded_product(fa: Operand, fb: Operand, b: torch.Tensor | None = None) -> torch.Tensor:
    """``RN32`` of every exact dot product of ``fa``'s rows and ``fb``'s columns (the
    three stages; non-finite entries already zero): float32 ``(..., M, N)``. ``b``: the
    float32 B itself where stage 1 may read it (:func:`_decode_first_pass`; required
    where ``fb`` holds no values: stages 2 and 3 then read ``b``, its flagged columns
    left to :func:`nan_where`)."""
    k = fa.values.shape[-1]
    staged = _decode_first_pass(fa, fb, b)
    if staged is None:
        mag = dot64(fa.blocks, fb.blocks)  # times inflation(...): magnitude(fa, fb)
        staged = first_pass(dot64(fa.values, fb.values), mag, depth(k), inflation(fa.blocks.shape[-1]))
    c, unsettled = staged
    if fb.values is not None:
        return _settle_pairs(c, unsettled, fa.values, fb.values)
    if fb.bad is not None and unsettled is not None:
        unsettled &= ~fb.bad
    return _settle_pairs(c, unsettled, fa.values, b)


#: the most rows of A for which a 2-D product whose float32 B is laid out by columns (a
#: weight, ``F.linear``'s layout) runs stage 1 as one numba pass over B's float32 values
#: (:func:`~detsample.invariant.exact_jit.decode_first_pass`) instead of a float64 GEMM
#: over B's float64 copy, a magnitude GEMM and a pass over their results: a decode step's
#: products are bound by reading their weights, and the copy is twice the bytes. Measured
#: on a Zen 2 (2 threads, the whole portable product, decode kernel against float64
#: GEMM): 1 x 1024 x 2752 0.46 against 2.34 ms, 8 rows 1.02 against 2.09, 16 1.90 / 2.79,
#: 32 3.66 / 4.28, 64 6.77 / 6.95; 8 x 576 x 1536 0.46 / 0.76, 64 rows 2.39 / 2.38
DECODE_ROWS = 64
#: a decode kernel's multiply-adds per "element" of :func:`~detsample.arith.cpu.split_rows`'s
#: threshold (vectorised: a few hundredths of a nanosecond each): it splits over the
#: threads from ~2M of them. Measured on a Zen 2 (whole product, 2 threads against 1): 8 x
#: 256 x 256 211 against 142 us, 8 x 576 x 576 299 / 310, 32 x 256 x 256 271 / 269, 8 x 576
#: x 1536 461 / 641
MACS_PER_ELEMENT = 32


def _decode_first_pass(
    fa: Operand, fb: Operand | None, b: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Stage 1 ``(c, unsettled)`` of a product (2-D, or batched: the attention's scores)
    of at most :data:`DECODE_ROWS` rows a matrix by the numba kernel that reads the
    float32 ``b (..., K, N)`` itself -- each matrix's columns contiguous rows -- or None
    where it does not apply (then the float64 GEMM). The same decisions: ``d`` within the
    same bound (each 256-long K-chunk summed in any order, the chunks in order). ``fb``
    None: B's block norms are computed by the kernel as it reads each column (no pass
    over ``b`` before; the keys of a decode step), and None is returned where a column
    holds a non-finite value (the caller then prepares ``b``'s norms and flags).
    ``unsettled`` is None where no element differs."""
    if not _reads_b(fa, b):
        return None
    jit, w = _jit_for(b), b.mT
    dense = _dense(w.detach().numpy().reshape((-1,) + tuple(w.shape[-2:])))
    *lead, m, k = fa.values.shape
    nb, n, nblk = math.prod(lead), w.shape[-2], fa.blocks.shape[-1]
    if fb is None:
        bblk, norm = np.empty(nb * n * nblk, np.float64), (BLOCK, inflation(BLOCK), 1.0 + 4 * _ULP)
    else:
        if not fb.blocks.mT.is_contiguous() or fb.blocks.shape[:-2] != fa.values.shape[:-2]:
            return None
        bblk, norm = fb.blocks.mT.detach().numpy().reshape(-1), (0, 0.0, 0.0)
    if dense is None:
        return None
    lo = np.empty(nb * m * n, np.float32)
    flags = np.empty(nb * m * n, np.bool_)
    a, ablk = (t.detach().numpy().reshape(-1) for t in (fa.values, fa.blocks))
    consts = (CHUNK, inflation(nblk), _slack(depth(k)), norm, (gamma(k), 2 * _ULP))
    counts = []

    def run(s: int, e: int) -> None:
        counts.append(jit.decode_first_pass(a, dense[0], ablk, bblk, (nb, m, k, n), dense[1], consts, lo, flags, s, e))

    split_rows(run, nb * n, nb * m * n * k // MACS_PER_ELEMENT)
    return _staged(lo, flags, tuple(lead) + (m, n), counts)


def _staged(
    lo: np.ndarray, flags: np.ndarray, shape: tuple[int, ...], counts: list[tuple[int, int]]
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """A kernel's stage 1 as ``(c, unsettled)`` shaped ``shape`` from its spans' counts
    ``(differ, refused)``: None where a span refused (a non-finite operand), the mask None
    where no element differs (nothing to settle)."""
    if any(refused for _, refused in counts):
        return None
    c = torch.from_numpy(lo).view(shape)
    return c, (torch.from_numpy(flags).view(shape) if any(differ for differ, _ in counts) else None)


def _reads_b(fa: Operand, b: torch.Tensor | None) -> bool:
    """Whether the decode kernel may take the product of ``fa`` with ``b``: a float32
    CPU ``b`` with numba, at most :data:`DECODE_ROWS` rows of A a matrix, its columns
    contiguous along K (checked further by :func:`_decode_first_pass`), A's values and
    norms contiguous, and the batch dims equal."""
    if b is None or b.dtype != torch.float32 or b.dim() not in (2, 3) or b.stride(-2) != 1 or b.numel() == 0:
        return False
    a = fa.values
    if a.dim() != b.dim() or a.shape[-2] > DECODE_ROWS or a.shape[:-2] != b.shape[:-2]:
        return False
    return _jit_for(b) is not None and a.is_contiguous() and fa.blocks.is_contiguous()


def matmul(a: torch.Tensor, b: torch.Tensor, fb: Operand | None = None) -> torch.Tensor:
    """The portable product ``a (..., M, K) @ b (..., K, N)`` (2-D, or batched with equal
    batch dims), in ``a``'s dtype (float32 results rounded once more for bfloat16 /
    float16 inputs); ``fb``: ``b`` already prepared (a cached weight).
    Guarantee: bitwise ``RN32`` of the exact products (the module's definition), on any
    CPU, BLAS and thread count."""
    c = _float32_product(prepare(a, -1), b, fb)
    return c if a.dtype in (torch.float32, torch.float64) else c.to(a.dtype)


def _float32_product(fa: Operand, b: torch.Tensor, fb: Operand | None) -> torch.Tensor:
    """:func:`matmul`'s float32 result, NaN where a row of A or a column of B held a
    non-finite value: the decode kernel where it reads ``b`` itself (computing ``b``'s
    norms as it reads it: no float64 copy), else ``b`` prepared (or ``fb``) and the three
    stages."""
    if fb is None and _reads_b(fa, b):
        staged = _decode_first_pass(fa, None, b)
        if staged is not None:
            return nan_where(_settle_pairs(*staged, fa.values, b), fa.bad)
        fb = prepare_norms(b)  # a non-finite column: its flag
    fb = prepare_b(b) if fb is None else fb
    return nan_where(_rounded_product(fa, fb, b), either(fa.bad, fb.bad))


def weighted_sum(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The portable ``p @ v`` for weights ``p (..., M, K)`` over the rows ("keys") of
    ``v (..., K, N)``: the same correctly rounded products, with the NaN rule of a value
    product: a non-finite value of ``v`` makes NaN only the rows that weigh its key (a
    zero weight -- the attention's future and padded keys -- changes nothing), a
    non-finite weight its own row. Returns float32."""
    fa = prepare(p, -1)
    staged = _keyed_first_pass(fa, v)
    if staged is not None:  # v held no non-finite value: no key to flag
        return nan_where(_settle_pairs(*staged, fa.values, v), fa.bad)
    fv, bad_keys = _prepare_keys(v)
    c = _rounded_product(fa, fv)
    bad = fa.bad
    if bad_keys is not None:
        touched = ((p != 0) & bad_keys.transpose(-1, -2)).any(dim=-1, keepdim=True)
        bad = either(bad, touched)
    return nan_where(c, bad)


#: the most weight rows a matrix for which :func:`weighted_sum` takes the keyed kernel;
#: past it the prepared path (a float64 GEMM over V's float64 copy, its cost shared by
#: the rows) is faster. Measured on a Zen 2 (48 matrices of 128 keys x 65 columns, 2
#: threads, the whole value product): 2 rows 0.28 against 0.46 ms, 8 0.45 / 0.64, 16
#: 0.78 / 0.85, 24 1.10 / 1.02, 32 1.39 / 1.15, 64 2.63 / 2.00; 288 matrices of 3 rows
#: 1.07 / 3.94
KEYED_ROWS = 16


def _keyed_first_pass(fa: Operand, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Stage 1 ``(c, unsettled)`` of :func:`weighted_sum` by the numba kernel that reads
    the float32 ``v (..., K, N)`` in its own layout (each matrix contiguous: the value
    blocks), with no float64 copy of ``v`` and no block norms
    (:func:`~detsample.invariant.exact_jit.keyed_first_pass`), for at most
    :data:`KEYED_ROWS` weight rows a matrix; None where it does not apply or where ``v``
    holds a non-finite value (the prepared path then keeps the zero-weight rule); the
    mask None where no element differs. The same bits: stage 1 decides nothing but which
    elements stages 2 and 3 settle."""
    a = fa.values
    if v.dtype != torch.float32 or v.dim() != a.dim() or v.dim() not in (2, 3) or v.shape[:-2] != a.shape[:-2]:
        return None
    if a.shape[-2] > KEYED_ROWS or not a.is_contiguous() or _jit_for(v) is None or v.numel() == 0:
        return None
    *lead, m, k = a.shape
    n = v.shape[-1]
    dense = _dense(_matrices(v.detach(), k, n))
    if dense is None:
        return None
    nb = math.prod(lead)
    lo = np.empty(nb * m * n, np.float32)
    flags = np.empty(nb * m * n, np.bool_)
    consts = (CHUNK, inflation(k), _slack(depth(k)), (gamma(k), 2 * _ULP))
    flat, counts = a.detach().numpy().reshape(-1), []
    values, bits, jit = dense[0], dense[0].view(np.int32), _kernels()

    def run(s: int, e: int) -> None:
        counts.append(jit.keyed_first_pass(flat, values, bits, dense[1], (nb, m, k, n), consts, lo, flags, s, e))

    split_rows(run, nb * m, nb * m * k * n // MACS_PER_ELEMENT)
    return _staged(lo, flags, tuple(lead) + (m, n), counts)


def _prepare_keys(v: torch.Tensor) -> tuple[Operand, torch.Tensor | None]:
    """``v (..., K, N)`` prepared along K, and its keys (rows) that hold a non-finite
    value (``(..., K, 1)`` bool, or None where none does)."""
    jit = _jit_for_operand(v)
    if jit is not None:
        return _prepare_cols(jit, v)
    bad_keys = ~torch.isfinite(v).all(dim=-1, keepdim=True)
    return prepare(v, -2), bad_keys if bool(bad_keys.any()) else None
