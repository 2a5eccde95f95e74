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

Every operand address a call sees is detsample's, not the caller's: ``A``'s tile and the
tile's output ``C`` start on a 64-byte boundary with a row stride that is a multiple of 64
bytes (``C`` is scratch of that form, copied out when ``N`` is not a multiple of 16
floats), and ``B`` starts on a 64-byte boundary (an aligned copy otherwise). A BLAS may
round by an operand's alignment -- measured: MKL's AMD code path gives a 1-row product
other bits when ``C`` starts 4 bytes past a 16-byte boundary -- so a call's alignment
class is fixed by construction, the same in the check and in every real call, rather
than sampled.

That a row's bits are then the same in every tile size of the ladder, at every position
and next to any neighbours (zeros included), and at every thread count, is a property of
the BLAS on this machine: :func:`detsample.invariant.verify.matmul_plan` checks it with
random data before the mode relies on it, and picks the ladder (and whether ``B`` runs in
its own layout or as a contiguous copy). The functions here only execute a plan.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

TILE = 64  # the largest tile (rows per call)
SIZES = (1, 2, 4, 8, 16, 32, 64)  # ladder candidates (powers of two up to TILE)
BIG = (128, 256, 512)  # big-tile candidates for long 2-D products
COL_BLOCK = 4096  # widest column block per call
_ALIGN = 64  # bytes: every row of a tile starts aligned


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


def _padded(cols: int, esize: int) -> int:
    """``cols`` rounded up to a whole number of 64-byte lines of ``esize``-byte elements."""
    step = max(1, _ALIGN // esize)
    return -(-cols // step) * step if cols else step


def aligned_empty(lead: tuple[int, ...], rows: int, cols: int, like: torch.Tensor, pad: bool = True) -> torch.Tensor:
    """An uninitialised ``lead + (rows, cols)`` tensor of ``like``'s dtype and device whose
    storage starts on a 64-byte boundary; ``pad``: its rows (and matrices) are 64-byte
    multiples apart (a view of a padded buffer), else it is contiguous. Over-allocated
    when the allocator's start is not aligned."""
    esize = like.element_size()
    cp = _padded(cols, esize) if pad else cols
    first = like.new_empty(lead + (rows, cp))
    if first.data_ptr() % _ALIGN == 0:  # torch's CPU allocator aligns to 64 bytes: one call
        return first if cp == cols else first[..., :cols]
    count = first.numel()
    flat = like.new_empty((count + _ALIGN // esize,))
    skip = (-flat.data_ptr() % _ALIGN) // esize
    return flat[skip : skip + count].view(lead + (rows, cp))[..., :cols]


def _aligned_rows(a: torch.Tensor, rows: int) -> torch.Tensor:
    """A ``(..., rows, K)`` tensor whose rows start on 64-byte boundaries, ``a`` in its
    first rows and zeros after: ``a`` itself when it already is one (contiguous, no padding
    rows, aligned start and row stride), else a copy."""
    k, m = a.shape[-1], a.shape[-2]
    esize = a.element_size()
    if rows == m and a.is_contiguous() and a.data_ptr() % _ALIGN == 0 and (k * esize) % _ALIGN == 0:
        return a
    buf = aligned_empty(a.shape[:-2], rows, k, a)
    buf[..., :m, :].copy_(a)
    if rows > m:
        buf[..., m:, :].zero_()
    return buf


def _aligned_b(b: torch.Tensor) -> torch.Tensor:
    """``b`` itself when its first element is 64-byte aligned, else an aligned copy with
    the strides the check's operand has: contiguous in its layout (row-major, or
    column-major for a transposed B), no padding."""
    if b.data_ptr() % _ALIGN == 0:
        return b
    col_major = b.stride(-2) == 1 and b.stride(-1) != 1  # a transposed B
    src = b.transpose(-1, -2) if col_major else b
    buf = aligned_empty(src.shape[:-2], src.shape[-2], src.shape[-1], src, pad=False)
    buf.copy_(src)
    return buf.transpose(-1, -2) if col_major else buf


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
    rows; zero rows pad the last): :func:`run` with the sizes spelled out. Every call's
    ``A``, ``B`` and ``C`` are 64-byte aligned with 64-byte-multiple row strides (see the
    module docstring); the result is contiguous."""
    batched = a.dim() == 3
    m, n = a.shape[-2], b.shape[-1]
    rows = sum(sizes)
    buf = _aligned_rows(a, rows)
    b = _aligned_b(b)
    out = aligned_empty(a.shape[:-2], rows, n, a)
    op = aten.bmm.out if batched else aten.mm.out
    if len(sizes) == 1 and rows == m:  # one whole tile: no views to cut
        op(buf, b, out=out)
        return out if out.is_contiguous() else out.contiguous()
    r0 = 0
    for size in sizes:
        if batched and len(sizes) > 1:
            part = aligned_empty(a.shape[:-2], size, n, a)
            op(buf[..., r0 : r0 + size, :], b, out=part)
            out[..., r0 : r0 + size, :] = part
        else:
            op(buf[..., r0 : r0 + size, :], b, out=out[..., r0 : r0 + size, :])
        r0 += size
    out = out if r0 == m else out[..., :m, :]
    return out if out.is_contiguous() else out.contiguous()
