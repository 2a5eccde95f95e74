"""Products in fixed-size row tiles: the verified fast matmul of the batch-invariant mode.

A BLAS picks its kernel from the call's shape (MKL switches sgemm kernels at row counts
that depend on K, N, the layout of B and the CPU), so a row of ``A @ B`` can round
differently in a 1-row call than in a 16-row one. Here the rows never decide the call:
``A``'s rows are copied into 64-byte-aligned tiles whose sizes come from a **ladder**
(a set of powers of two up to :data:`TILE`), ``M = q * top + r`` runs as ``q`` tiles of its
largest size ``top`` and, for ``r > 0``, one tile of the smallest ladder size ``>= r`` (zero
rows pad it),
and ``B``'s columns as blocks of at most :data:`COL_BLOCK` (fixed by ``N`` alone: the
caller runs each block, with its own plan). Every call therefore has one of a few shapes,
each a function of the ladder, K and the block's width only.

That a row's bits are then the same in every tile size of the ladder, at every position
and next to any neighbours (zeros included), and at every thread count, is a property of
the BLAS on this machine: :func:`detsample.invariant.verify.matmul_plan` checks it with
random data before the mode relies on it, and picks the ladder (and whether ``B`` runs in
its own layout or as a contiguous copy). The functions here only execute a plan.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

TILE = 64                                  # the largest tile (rows per call)
SIZES = (1, 2, 4, 8, 16, 32, 64)           # ladder candidates (powers of two up to TILE)
BIG = (128, 256, 512)                      # big-tile candidates for long 2-D products
COL_BLOCK = 4096                           # widest column block per call
_ALIGN = 64                                # bytes: every row of a tile starts aligned


def tile_sizes(m: int, ladder: tuple[int, ...]) -> list[int]:
    """The tile sizes ``m`` rows run as: ``m // top`` tiles of the ladder's largest size
    ``top``, the rest in one tile of the smallest size that holds it (zero-padded)."""
    top = ladder[-1]
    q, r = divmod(m, top)
    sizes = [top] * q
    if r:
        sizes.append(next(s for s in ladder if s >= r))
    return sizes


#: row counts the cost of a ladder is estimated over (decode batches to a prefill)
COST_ROWS = (1, 2, 5, 8, 13, 24, 64, 100, 512)


def ladder_cost(ladder: tuple[int, ...]) -> float:
    """Estimated cost of ``ladder`` over :data:`COST_ROWS`: per tile one call (worth 8
    rows of work) plus its rows, padding included."""
    return sum(1.0 + size / 8.0 for m in COST_ROWS for size in tile_sizes(m, ladder))


def col_blocks(n: int) -> list[tuple[int, int]]:
    """``[(c0, c1)]``: ``n`` columns in blocks of COL_BLOCK, the last one narrower."""
    return [(c, min(c + COL_BLOCK, n)) for c in range(0, n, COL_BLOCK)] or [(0, 0)]


def _aligned_rows(a: torch.Tensor, rows: int) -> torch.Tensor:
    """A ``(..., rows, K)`` tensor whose rows start on 64-byte boundaries, ``a`` in its
    first rows and zeros after: ``a`` itself when it already is one (contiguous, no padding
    rows, aligned start and row stride), else a copy."""
    k, m = a.shape[-1], a.shape[-2]
    esize = a.element_size()
    if (rows == m and a.is_contiguous() and a.data_ptr() % _ALIGN == 0
            and (k * esize) % _ALIGN == 0):
        return a
    step = max(1, _ALIGN // esize)
    kp = -(-k // step) * step if k else step
    buf = a.new_empty(a.shape[:-2] + (rows, kp))[..., :k]
    buf[..., :m, :].copy_(a)
    if rows > m:
        buf[..., m:, :].zero_()
    return buf


def big_split(m: int, big: tuple[int, ...]) -> tuple[list[int], int]:
    """``(big tile sizes, rows left)``: ``m`` rows taken greedily in the largest of ``big``
    that fits (no padding), the rest (fewer rows than ``big[0]``) for the ladder."""
    sizes = []
    for size in sorted(big, reverse=True):
        while m >= size:
            sizes.append(size)
            m -= size
    return sizes, m


def run(a: torch.Tensor, b: torch.Tensor, ladder: tuple[int, ...]) -> torch.Tensor:
    """``a @ b`` for ``a (M, K)``, ``b (K, N)`` (or batched ``(nb, M, K)``, ``(nb, K, N)``;
    ``N`` one column block) in tiles of ``ladder``; returns a contiguous ``(..., M, N)`` in
    ``a``'s dtype (the caller has made both operands the compute dtype)."""
    return run_sizes(a, b, tile_sizes(a.shape[-2], ladder))


def run_sizes(a: torch.Tensor, b: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """``a @ b`` in tiles of exactly ``sizes`` rows, in order (their sum at least ``a``'s
    rows; zero rows pad the last): :func:`run` with the sizes spelled out."""
    batched = a.dim() == 3
    m, n = a.shape[-2], b.shape[-1]
    buf = _aligned_rows(a, sum(sizes))
    out = a.new_empty(a.shape[:-2] + (sum(sizes), n))
    op = aten.bmm.out if batched else aten.mm.out
    r0 = 0
    for size in sizes:
        if batched and len(sizes) > 1:
            part = out.new_empty(out.shape[:-2] + (size, n))
            op(buf[..., r0: r0 + size, :], b, out=part)
            out[..., r0: r0 + size, :] = part
        else:
            op(buf[..., r0: r0 + size, :], b, out=out[..., r0: r0 + size, :])
        r0 += size
    return out if r0 == m else out[..., :m, :].contiguous()
