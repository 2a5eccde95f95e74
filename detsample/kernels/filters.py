"""Pipeline steps 8 and 9 in Triton: top-k / top-p / element-wise thresholds and the draw.

The same semantics as :mod:`detsample.ops.filters` and :mod:`detsample.ops.draw`, decided
by VALUES with exact int64 fixed-point masses ``q = trunc(exp(z) * 2**F)``, ``exp`` being
detsample's (:func:`~detsample.kernels.common.exp32`, :func:`detsample.arith.exp` bit
for bit; never ``tl.exp``):

* top-k keeps ``z >= s_{k-1}`` (the k-th largest value, ties at the boundary kept);
* top-p keeps a survivor when the mass strictly above its value is
  ``float64(above) < top_p * float64(Z)`` (``Z`` = survivors' mass);
* the element-wise filters (:data:`detsample.rules.ELEMENT_FILTERS`: min-p keeps
  ``exp(z)`` at least its parameter) keep what
  :func:`~detsample.kernels.common.element_keeps` keeps;
* the draw takes ``t = min(floor(u * float64(Q)), Q - 1)`` over the kept mass ``Q`` and
  returns the first token id, **in token-id order**, whose running mass exceeds ``t``.

Three kernels, one program per row each, chosen per row by a host-side route that
selects how the work is done, never the result (every route computes the same ``q``
with the same ``exp32`` and exact integer sums):

* ``_topk_draw_kernel`` (rows with ``top_k <= CAND_MAX``): a 4-pass radix select finds
  the exact k-th largest value; the survivors ``z >= s_{k-1}`` are compacted in token-id
  order into a buffer of ``KP`` slots, sorted by value in registers for top-p, and the
  draw runs over the buffer. The tie-spill proof: the radix select also counts the
  survivors, and a row whose survivors (ties included) do not fit in ``KP`` slots is
  flagged and falls back to the sort route, alone.
* ``_sorted_threshold_kernel`` (top-p without a small top-k, and spilled rows): the
  row's values sorted by ``torch.sort`` (values only: ordering is exact and needs no
  exp) are scanned for the kept threshold, then
* ``_draw_full_kernel`` (every row not drawn from a buffer): exact block sums of the kept
  mass over the whole vocabulary, then a search inside the chosen block.

Bitwise batch-invariant, and the same thresholds' kept sets, exact masses and tokens as
the torch backend's step 8-9 (the same ``exp``, the same integer rules of
:mod:`detsample.rules`) on any device that rounds float64 ``+ - *`` and conversions as
IEEE without contraction (docs/gpu.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from detsample import rules
from detsample.kernels.common import (
    ELEMENT_FILTERS,
    OPTS,
    PAD_ID,
    check_device,
    draw_target,
    element_keeps,
    exp32,
    first_above,
    fq_mass,
    order_key,
    row_block,
    top_p_keeps,
    top_p_limit,
)

#: rows whose top_k is at most this use the radix-select candidate kernel
CAND_MAX = 1024


@triton.jit
def _kth_largest_key(zrow, V, k, BLOCK: tl.constexpr):
    """(key of the k-th largest value of the row, number of values >= it): radix
    select over the 32-bit order keys, 8 bits per pass, counts by histogram."""
    offs = tl.arange(0, BLOCK)
    bins = tl.arange(0, 256)
    prefix = tl.full([], 0, tl.uint32)
    pmask = tl.full([], 0, tl.uint32)
    kk = k
    hd = k * 0
    for p in tl.static_range(4):
        shift = 24 - 8 * p
        hist = tl.zeros((256,), tl.int32)
        for start in range(0, V, BLOCK):
            idx = start + offs
            key = order_key(tl.load(zrow + idx, mask=idx < V, other=0.0))
            match = (idx < V) & ((key & pmask) == prefix)
            hist += tl.histogram(((key >> shift) & 0xFF).to(tl.int32), 256, mask=match)
        ge = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # count with digit >= bin
        d = tl.max(tl.where(ge >= kk, bins, -1), 0)
        hd = tl.sum(tl.where(bins == d, hist, 0), 0)
        kk = kk - (tl.sum(tl.where(bins == d, ge, 0), 0) - hd)
        prefix = prefix | (d.to(tl.uint32) << shift)
        pmask = pmask | (tl.full([], 0xFF, tl.uint32) << shift)
    return prefix, k - kk + hd


@triton.jit
def _topk_draw_kernel(
    z_ptr,
    stride,
    V,
    rows_ptr,
    k_ptr,
    p_ptr,
    el_ptr,
    el_stride,
    u_ptr,
    bufv_ptr,
    bufi_ptr,
    tau_ptr,
    total_ptr,
    tok_ptr,
    spill_ptr,
    FRAC: tl.constexpr,
    BLOCK: tl.constexpr,
    KP: tl.constexpr,
    CH: tl.constexpr,
    DRAW: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    row = tl.load(rows_ptr + i)
    zrow = z_ptr + row * stride
    k = tl.load(k_ptr + row).to(tl.int32)
    thr, c = _kth_largest_key(zrow, V, k, BLOCK)
    if c > KP:
        tl.store(spill_ptr + i, 1)
    else:
        tl.store(spill_ptr + i, 0)
        offs = tl.arange(0, BLOCK)
        bufv = bufv_ptr + i * KP
        bufi = bufi_ptr + i * KP
        running = c * 0
        for start in range(0, V, BLOCK):  # survivors, compacted in token-id order
            idx = start + offs
            z = tl.load(zrow + idx, mask=idx < V, other=0.0)
            surv = (idx < V) & (order_key(z) >= thr)
            pos = running + tl.cumsum(surv.to(tl.int32), 0) - 1
            tl.store(bufv + pos, z, mask=surv)
            tl.store(bufi + pos, idx.to(tl.int64), mask=surv)
            running += tl.sum(surv.to(tl.int32), 0)
        tl.debug_barrier()
        j = tl.arange(0, KP)
        valid = j < c
        v = tl.load(bufv + j, mask=valid, other=float("-inf"))
        ids = tl.load(bufi + j, mask=valid, other=PAD_ID)
        top_p = tl.load(p_ptr + row)
        e = exp32(v)
        q = tl.where(valid, fq_mass(e, FRAC), 0)
        # top-p: the exact mass strictly above each survivor's value, by comparing it
        # with every survivor (chunks of CH), so no sort and no order enters
        above = tl.zeros((KP,), tl.int64)
        for cs in range(0, c, CH):
            jc = cs + tl.arange(0, CH)
            vc = tl.load(bufv + jc, mask=jc < c, other=float("-inf"))
            qc = tl.where(jc < c, fq_mass(exp32(vc), FRAC), 0)
            above += tl.sum(tl.where(vc[None, :] > v[:, None], qc[None, :], 0), 1)
        limit = top_p_limit(top_p, tl.sum(q, 0))
        # each rule keeps every value above a threshold, so the kept set is z >= tau
        kept = valid & top_p_keeps(above, limit) & element_keeps(e, el_ptr + row * el_stride)
        tau = tl.min(tl.where(kept, v, float("inf")), 0)
        q = tl.where(kept, q, 0)
        total = tl.sum(q, 0)
        tl.store(tau_ptr + row, tau)
        tl.store(total_ptr + row, total)
        if DRAW:
            t = draw_target(tl.load(u_ptr + row), total)
            # the first running mass above t, in token-id order: ids[first_above(...)]
            tok = tl.min(tl.where(tl.cumsum(q, 0) > t, ids, PAD_ID), 0)
            tl.store(tok_ptr + row, tok)


@triton.jit
def _sorted_threshold_kernel(
    s_ptr, stride, V, rows_ptr, k_ptr, p_ptr, el_ptr, el_stride, tau_ptr, FRAC: tl.constexpr, BLOCK: tl.constexpr
):
    i = tl.program_id(0).to(tl.int64)
    row = tl.load(rows_ptr + i)
    srow = s_ptr + i * stride
    kth = tl.load(srow + tl.load(k_ptr + row).to(tl.int64) - 1)
    top_p = tl.load(p_ptr + row)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.int64)
    for start in range(0, V, BLOCK):  # Z: mass of the top-k survivors
        idx = start + offs
        s = tl.load(srow + idx, mask=idx < V, other=float("-inf"))
        acc += tl.where((idx < V) & (s >= kth), fq_mass(exp32(s), FRAC), 0)
    limit = top_p_limit(top_p, tl.sum(acc, 0))
    # top-p: the mass above a value is the exclusive running sum at the first element of
    # its run of ties; that sum is non-decreasing, so the kept values are those >= s[G]
    # with G the last position whose exclusive running sum is below the limit
    g = tl.sum(acc * 0, 0)
    base = g
    for start in range(0, V, BLOCK):
        idx = start + offs
        s = tl.load(srow + idx, mask=idx < V, other=float("-inf"))
        q = tl.where((idx < V) & (s >= kth), fq_mass(exp32(s), FRAC), 0)
        excl = base + tl.cumsum(q, 0) - q
        g += tl.sum(((idx < V) & top_p_keeps(excl, limit)).to(tl.int64), 0)
        base += tl.sum(q, 0)
    floor = tl.maximum(kth, tl.load(srow + g - 1))
    tau = tl.full([], float("inf"), tl.float32)
    for start in range(0, V, BLOCK):  # the element-wise filters, and the smallest value kept
        idx = start + offs
        s = tl.load(srow + idx, mask=idx < V, other=float("-inf"))
        kept = (idx < V) & (s >= floor) & element_keeps(exp32(s), el_ptr + row * el_stride)
        tau = tl.minimum(tau, tl.min(tl.where(kept, s, float("inf")), 0))
    tl.store(tau_ptr + row, tau)


@triton.jit
def _draw_full_kernel(
    z_ptr,
    stride,
    V,
    rows_ptr,
    tau_ptr,
    el_ptr,
    el_stride,
    u_ptr,
    total_ptr,
    tok_ptr,
    FRAC: tl.constexpr,
    BLOCK: tl.constexpr,
    NB: tl.constexpr,
    DRAW: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    row = tl.load(rows_ptr + i)
    zrow = z_ptr + row * stride
    tau = tl.load(tau_ptr + row)
    el = el_ptr + row * el_stride
    offs = tl.arange(0, BLOCK)
    nb = tl.arange(0, NB)
    sums = tl.zeros((NB,), tl.int64)
    for b in range(0, tl.cdiv(V, BLOCK)):  # exact kept mass per block
        idx = b * BLOCK + offs
        z = tl.load(zrow + idx, mask=idx < V, other=float("-inf"))
        e = exp32(z)
        q = tl.where((idx < V) & (z >= tau) & element_keeps(e, el), fq_mass(e, FRAC), 0)
        sums = tl.where(nb == b, tl.sum(q, 0), sums)
    total = tl.sum(sums, 0)
    tl.store(total_ptr + row, total)
    if DRAW:
        t = draw_target(tl.load(u_ptr + row), total)
        bc = tl.cumsum(sums, 0)
        blk = first_above(bc, t)  # the first block whose running sum > t
        base = tl.sum(tl.where(nb == blk - 1, bc, 0), 0)
        idx = blk * BLOCK + offs
        z = tl.load(zrow + idx, mask=idx < V, other=float("-inf"))
        e = exp32(z)
        q = tl.where((idx < V) & (z >= tau) & element_keeps(e, el), fq_mass(e, FRAC), 0)
        j = first_above(base + tl.cumsum(q, 0), t)
        tl.store(tok_ptr + row, blk.to(tl.int64) * BLOCK + j)


def _route(top_k: list[int], top_p: list[float], V: int, sort_only: bool) -> tuple[list[int], list[int], list[int]]:
    """Positions of (candidate, sort, plain) rows from each row's own parameters."""
    cand, sort, plain = [], [], []
    for j, (k, p) in enumerate(zip(top_k, top_p)):
        if k < V and k <= CAND_MAX and not sort_only:
            cand.append(j)
        elif k < V or p < 1.0:
            sort.append(j)
        else:
            plain.append(j)
    return cand, sort, plain


@dataclass(frozen=True)
class _Launch:
    """What the three kernels of one call share: the contiguous (B, V) ``z``, the
    per-row filters (``top_k`` int64, ``top_p`` float64, ``element`` (B, F) float32),
    the uniforms ``u`` (float64, zeros without a draw), the outputs ``tau`` / ``total``
    / ``tokens`` (B,), and the launch constants."""

    z: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    element: torch.Tensor
    u: torch.Tensor
    tau: torch.Tensor
    total: torch.Tensor
    tokens: torch.Tensor
    frac: int
    draw: bool

    @property
    def block(self) -> int:
        return row_block(self.z.shape[1])

    def index(self, rows: list[int]) -> torch.Tensor:
        return torch.tensor(sorted(rows), dtype=torch.int64, device=self.z.device)


def _check_element_filters(element: torch.Tensor) -> None:
    names = tuple(f.name for f in rules.ELEMENT_FILTERS)
    if names != ELEMENT_FILTERS or element.shape[-1] != len(names):
        raise NotImplementedError(
            f"the Triton kernels spell the element-wise filters {ELEMENT_FILTERS}, the registry "
            f"holds {names} ({element.shape[-1]} columns given): a new filter's test is spelled "
            f"in detsample.kernels.common.element_keeps"
        )


def _candidate_rows(k: _Launch, rows: list[int]) -> list[int]:
    """``_topk_draw_kernel`` over ``rows`` (small top-k); returns the rows whose
    survivors did not fit their buffer (they take the sort route)."""
    ci = torch.tensor(rows, dtype=torch.int64, device=k.z.device)
    kp = max(16, triton.next_power_of_2(int(k.top_k[ci].max()) + 1))
    n, dev = len(rows), k.z.device
    bufv = torch.empty((n, kp), dtype=torch.float32, device=dev)
    bufi = torch.empty((n, kp), dtype=torch.int64, device=dev)
    spill = torch.empty((n,), dtype=torch.int32, device=dev)
    _topk_draw_kernel[(n,)](
        k.z,
        k.z.stride(0),
        k.z.shape[1],
        ci,
        k.top_k,
        k.top_p,
        k.element,
        k.element.stride(0),
        k.u,
        bufv,
        bufi,
        k.tau,
        k.total,
        k.tokens,
        spill,
        FRAC=k.frac,
        BLOCK=k.block,
        KP=kp,
        CH=min(kp, 16),
        DRAW=k.draw,
        **OPTS,
    )
    return [rows[j] for j in spill.nonzero().flatten().tolist()]


def _sorted_rows(k: _Launch, rows: list[int]) -> None:
    """``_sorted_threshold_kernel`` over ``rows``: their thresholds from the sorted row."""
    si = k.index(rows)
    sz = torch.sort(k.z.index_select(0, si), dim=-1, descending=True).values
    _sorted_threshold_kernel[(len(si),)](
        sz,
        sz.stride(0),
        k.z.shape[1],
        si,
        k.top_k,
        k.top_p,
        k.element,
        k.element.stride(0),
        k.tau,
        FRAC=k.frac,
        BLOCK=k.block,
        **OPTS,
    )


def _full_rows(k: _Launch, rows: list[int]) -> None:
    """``_draw_full_kernel`` over ``rows``: the kept mass and the draw over the row."""
    fi = k.index(rows)
    V = k.z.shape[1]
    nb = triton.next_power_of_2(triton.cdiv(V, k.block))
    _draw_full_kernel[(len(fi),)](
        k.z,
        k.z.stride(0),
        V,
        fi,
        k.tau,
        k.element,
        k.element.stride(0),
        k.u,
        k.total,
        k.tokens,
        FRAC=k.frac,
        BLOCK=k.block,
        NB=nb,
        DRAW=k.draw,
        **OPTS,
    )


def thresholds_and_draw(
    z: torch.Tensor,
    rows: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    element: torch.Tensor,
    u: torch.Tensor | None,
    frac: int,
    sort_only: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Steps 8-9 for the sampling ``rows`` of scaled logits ``z``.

    z: (B, V) float32, each sampled row's max exactly 0 (:func:`scale_logits`); rows:
    (n,) int64 row indices; top_k: (B,) int (``V`` when disabled), top_p: (B,) float64,
    element: (B, F) float32 the element-wise filters' parameters (the registry's filters
    must be those the kernels spell: ``kernels.common.ELEMENT_FILTERS``, else
    NotImplementedError); u: (B,) float64 uniforms, or None to compute only the
    thresholds and masses (the rescoring path); frac: fixed-point bits
    (:func:`detsample.rules.frac_bits`); sort_only: route every filtered row
    through the sort (the reference route; same bits).
    Returns ``(tau, total, tokens)``, each (B,): the kept threshold (float32, -inf
    elsewhere), the exact kept mass (int64, 0 elsewhere) and the drawn token (int64,
    -1 elsewhere or without ``u``), the same quantities as the torch sampler's step 8.
    """
    check_device(z.device)
    _check_element_filters(element)
    B, V = z.shape
    dev = z.device
    k = _Launch(
        z if z.stride(-1) == 1 else z.contiguous(),
        top_k.to(torch.int64).contiguous(),
        top_p.to(torch.float64).contiguous(),
        element.to(torch.float32).contiguous(),
        (u.to(torch.float64).contiguous() if u is not None else torch.zeros((B,), dtype=torch.float64, device=dev)),
        torch.full((B,), float("-inf"), dtype=torch.float32, device=dev),
        torch.zeros((B,), dtype=torch.int64, device=dev),
        torch.full((B,), -1, dtype=torch.int64, device=dev),
        frac,
        u is not None,
    )
    if rows.numel():
        rl = rows.tolist()
        cand, sort, plain = _route(k.top_k[rows].tolist(), k.top_p[rows].tolist(), V, sort_only)
        sort = [rl[j] for j in sort]
        if cand:
            sort += _candidate_rows(k, [rl[j] for j in cand])
        if sort:
            _sorted_rows(k, sort)
        full = [rl[j] for j in plain] + sort
        if full:
            _full_rows(k, full)
    return k.tau, k.total, k.tokens
