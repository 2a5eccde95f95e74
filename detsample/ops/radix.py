"""Step 8 without a sort: the thresholds of :func:`~detsample.ops.filters.thresholds_by_sort`
by a two-level radix select on the values' bits.

A top-p row whose nucleus holds tens of thousands of tokens (a flat distribution: a high
temperature, an uncertain position) outgrows every bounded candidate set and used to
take the full stable sort of its row -- 20 ms a row at V = 152064, plus the filters'
passes over the sorted row. Every filter keeps a set ``{z_i >= tau}`` and the top-p rule
reads only *the mass strictly above a value*, so the threshold can be found by value:

* the scaled logits of the cut are max-shifted (``z <= 0``, ``-inf`` allowed), so the low
  31 bits ``m`` of a value's float32 pattern order it: a larger value has a smaller
  ``m``, and equal values share ``m`` (``-0.0`` and ``0.0`` too; a zero threshold is
  then given the sign of the row's last zero, the one a stable sort puts last);
* level 1 sums the exact fixed-point masses ``q`` of the top-k survivors in
  ``2**14`` bins of ``m >> 17``; the exclusive running sum over bins is the mass strictly
  above the largest value of each bin, so the threshold lies in the last bin whose
  running sum passes ``float64(above) < top_p * float64(Z)``;
* two more levels do the same over the next 10 and the last 7 bits of the elements of
  that bin only; at the last, one bin is one value.

Sums are exact integers (order-free), the comparison is the one of the sort path, and
the element-wise filters (:data:`detsample.rules.ELEMENT_FILTERS`) and top-k are value
thresholds of their own (their kept sets are upward closed too), so the result is the
sort's threshold, bit for bit (tests/ops/test_radix.py).
"""

from __future__ import annotations

import torch

from detsample import arith, rules
from detsample.ops.filters import passing_prefix, thresholds_by_sort, topk_threshold

_HI_SHIFT = 17  # level 1 bins m >> 17 (2**14 bins: the exponent and 6 mantissa bits)
_HI_BINS = 1 << (31 - _HI_SHIFT)
_LEVELS = ((7, 0x3FF), (0, 0x7F))  # then 10 and 7 bits inside the chosen bin


def thresholds_by_select(
    z: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    element: torch.Tensor,
    frac: int,
    *,
    out: torch.Tensor | None = None,
    q_out: torch.Tensor | None = None,
    key_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`~detsample.ops.filters.thresholds_by_sort`, bit for bit, without sorting.

    z: (rows, V) float32 max-shifted scaled logits (every value ``<= 0`` or ``-inf``; a
    row with a positive value is handed to the sort); top_k: (rows,) int; top_p: (rows,)
    float; element: (rows, F) float32 the element-wise filters' parameters; frac:
    fixed-point fraction bits; ``out`` / ``q_out`` / ``key_out``: optional (rows, V)
    float32 / int64 / int64 scratch (reused buffers spare the page faults of fresh
    (rows, V) tensors: ~10 ms each at 64 x 152064). Returns (rows,)
    float32 thresholds: the kept set of row r is ``z[r] >= tau[r]``. Bitwise
    batch-invariant: each row's threshold depends on that row alone.
    """
    rows, V = z.shape
    if rows == 0:
        return torch.empty(0, dtype=z.dtype, device=z.device)
    bits = z.view(torch.int32)
    if bool(bits.amax() > 0):  # not max-shifted (a positive value): the reference path
        return thresholds_by_sort(z, top_k, top_p, element, frac)
    tau = topk_threshold(z, top_k)  # the smallest top-k survivor ...
    cut_k = bool(torch.isfinite(tau).any())  # (a top-p row's tau stays its k-th value
    #                                           until its own assignment below)
    tp = top_p.to(torch.float64)
    nucleus = tp < 1.0
    # ... which, without a top-k, is the row's minimum (a top-p row's threshold is a
    # survivor whatever it is: it needs none)
    off = ((top_k.to(torch.int64) >= V) & ~nucleus).nonzero().flatten()
    if off.numel():
        tau[off] = z.index_select(0, off).amin(-1)
    pr = nucleus.nonzero().flatten()
    el = element.to(torch.float32)
    by_value = bool(rules.element_active(el).any())
    if pr.numel():  # (a top-k spill alone needs no mass)
        scratch = (out, q_out, key_out)
        tau[pr] = _nucleus_thresholds(z, pr, tau[pr] if cut_k else None, tp[pr], frac, scratch)
    if by_value:  # the smallest value every element-wise filter keeps
        e = arith.exp(z)
        lowest = torch.where(rules.element_keeps(e, el), z, torch.full_like(z, float("inf")))
        tau = torch.maximum(tau, lowest.amin(-1))
    zero = (tau == 0).nonzero().flatten()
    if zero.numel():  # the sort's threshold is its row's last zero (-0.0 or 0.0: a stable
        zr = z.index_select(0, zero)  # sort keeps equal values in id order)
        last = V - 1 - (zr == 0).flip(-1).to(torch.int8).argmax(-1)
        tau[zero] = zr.gather(1, last.unsqueeze(1)).squeeze(1)
    return tau


def _nucleus_thresholds(
    z: torch.Tensor, pr: torch.Tensor, tau_k: torch.Tensor | None, tp: torch.Tensor, frac: int, scratch: tuple
) -> torch.Tensor:
    """The thresholds of the top-p rows ``pr`` of ``z``: their top-k thresholds ``tau_k``
    (None: no row has a top-k) raised to the value where the kept mass reaches ``tp``
    (float64); ``scratch``: the caller's optional (out, q_out, key_out) buffers."""
    out, q_out, key_out = scratch
    n = pr.numel()
    zp = z if n == z.shape[0] else z.index_select(0, pr)
    w = torch.empty(zp.shape, dtype=torch.float32, device=z.device) if out is None else out[:n]
    q, total = rules.cut_masses(zp, frac, tau=tau_k, out=w, q_out=None if q_out is None else q_out[:n])
    limit = rules.top_p_limit(tp, total.squeeze(1))  # survivors only
    key = torch.empty(zp.shape, dtype=torch.int64, device=z.device) if key_out is None else key_out[:n]
    lowest = tau_k if tau_k is not None else torch.full((n,), -float("inf"), device=z.device)
    return torch.maximum(lowest, _nucleus_value(zp.view(torch.int32), q, limit, (w.view(torch.int32), key)))


def _nucleus_value(
    bits: torch.Tensor, q: torch.Tensor, limit: torch.Tensor, scratch: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """The smallest top-k survivor value whose mass strictly above passes
    ``float64(above) < limit``. bits: (r, V) int32 float32 patterns of the values (all
    ``<= 0``: the low 31 bits ``m`` order them, larger value first); q: (r, V)
    int64 masses (0 off the survivors); limit: (r,) float64 ``top_p * Z`` with
    ``top_p < 1``; scratch: (r, V) int32 and int64 buffers. Returns (r,) float32. A value below every
    survivor has all of ``Z`` above it, which never passes (``float64(Z) < top_p *
    float64(Z)`` is false), so the top-k casualties need no exclusion.

    Level 1 bins the whole rows by ``m >> 17`` (a row-wise ``scatter_add_``: parallel
    over the rows, where a flat ``index_add_`` is one serial loop); the next two bin
    only the elements of the chosen bin, by the next 10 and the last 7 bits (there one
    bin is one value)."""
    r, V = bits.shape
    hi, index = scratch  # level 1's bins, as int32 and as the int64 scatter index
    torch.bitwise_and(bits, 0x7FFFFFFF, out=hi).bitwise_right_shift_(_HI_SHIFT)
    mass = torch.zeros(r, _HI_BINS, dtype=torch.int64, device=bits.device)
    mass.scatter_add_(1, index.copy_(hi), q)
    above = mass.cumsum(-1).sub_(mass)
    b = _last_passing(above, limit)
    base = above.gather(1, b.unsqueeze(1)).squeeze(1)  # mass above bin b
    ri, ci = (hi == b.to(torch.int32).unsqueeze(1)).nonzero(as_tuple=True)
    flat = ri * V + ci
    mm, qq = torch.take(bits, flat) & 0x7FFFFFFF, torch.take(q, flat)
    value = b << _HI_SHIFT
    for shift, mask in _LEVELS:  # over the chosen bin's elements only
        digit = ((mm >> shift) & mask).to(torch.int64)
        mass = torch.zeros(r * (mask + 1), dtype=torch.int64, device=bits.device)
        mass.index_add_(0, ri * (mask + 1) + digit, qq)
        mass = mass.view(r, mask + 1)
        above = mass.cumsum(-1).sub_(mass).add_(base.unsqueeze(1))
        d = _last_passing(above, limit)
        base = above.gather(1, d.unsqueeze(1)).squeeze(1)
        value = value | (d << shift)
        keep = digit == d[ri]
        ri, mm, qq = ri[keep], mm[keep], qq[keep]
    mstar = value.to(torch.int32)
    sign = torch.where(mstar == 0, 0, -(2**31)).to(torch.int32)
    return (mstar | sign).view(torch.float32)


def _last_passing(above: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """(r,) int64 index of the last bin whose mass above passes the limit. ``above`` never
    decreases along a row, so the passing bins are a prefix. The last one is never
    empty: an empty bin has the mass above the next nonempty bin (or all of ``Z``, which
    fails), so when it passes, so does that bin. The first bin always passes (nothing is
    above the row's largest value)."""
    return passing_prefix(above, limit.unsqueeze(1)) - 1
