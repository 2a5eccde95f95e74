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
  ``2**11`` bins of ``m >> 20``; the exclusive running sum over bins is the mass strictly
  above the largest value of each bin, so the threshold lies in the last bin whose
  running sum passes ``float64(above) < top_p * float64(Z)``;
* two more levels do the same over the next 10 and the last 10 bits of the elements of
  that bin only; at the last, one bin is one value.

Sums are exact integers (order-free), the comparison is the one of the sort path, and
the element-wise filters (:data:`detsample.rules.ELEMENT_FILTERS`) and top-k are value
thresholds of their own (their kept sets are upward closed too), so the result is the
sort's threshold, bit for bit (tests/ops/test_radix.py).
"""

from __future__ import annotations

import torch

from detsample import rules
from detsample.ops.filters import passing_prefix, thresholds_by_sort, topk_threshold

_HI_SHIFT = 20  # level 1 bins m >> 20 (2**11 bins: the exponent and 3 mantissa bits)
_HI_BINS = 1 << (31 - _HI_SHIFT)
_LEVELS = ((10, 0x3FF), (0, 0x3FF))  # then 10 and 10 bits inside the chosen bin


def thresholds_by_select(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                         element: torch.Tensor, frac: int) -> torch.Tensor:
    """:func:`~detsample.ops.filters.thresholds_by_sort`, bit for bit, without sorting.

    z: (rows, V) float32 max-shifted scaled logits (every value ``<= 0`` or ``-inf``; a
    row with a positive value is handed to the sort); top_k: (rows,) int; top_p: (rows,)
    float; element: (rows, F) float32 the element-wise filters' parameters; frac:
    fixed-point fraction bits. Returns (rows,)
    float32 thresholds: the kept set of row r is ``z[r] >= tau[r]``. Bitwise
    batch-invariant: each row's threshold depends on that row alone.
    """
    rows, V = z.shape
    if rows == 0:
        return torch.empty(0, dtype=z.dtype, device=z.device)
    bits = z.view(torch.int32)
    if bool((bits > 0).any()):  # not max-shifted (a positive value): the reference path
        return thresholds_by_sort(z, top_k, top_p, element, frac)
    tau = topk_threshold(z, top_k)  # the smallest top-k survivor ...
    surv = z >= tau.unsqueeze(1) if bool(torch.isfinite(tau).any()) else None
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
    e = torch.exp(z) if pr.numel() or by_value else None  # (a top-k spill alone: no mass)
    if pr.numel():
        every = pr.numel() == rows
        q = rules.mass(e if every else e.index_select(0, pr), frac)
        if surv is not None:
            q.mul_(surv if every else surv.index_select(0, pr))
        limit = rules.top_p_limit(tp[pr], q.sum(-1))
        m = (bits if every else bits.index_select(0, pr)) & 0x7FFFFFFF
        tau[pr] = torch.maximum(tau[pr], _nucleus_value(m, q, limit))
    if by_value:  # the smallest value every element-wise filter keeps
        lowest = torch.where(rules.element_keeps(e, el), z, torch.full_like(z, float("inf")))
        tau = torch.maximum(tau, lowest.amin(-1))
    zero = (tau == 0).nonzero().flatten()
    if zero.numel():  # the sort's threshold is its row's last zero (-0.0 or 0.0: a stable
        zr = z.index_select(0, zero)  # sort keeps equal values in id order)
        last = V - 1 - (zr == 0).flip(-1).to(torch.int8).argmax(-1)
        tau[zero] = zr.gather(1, last.unsqueeze(1)).squeeze(1)
    return tau


def _nucleus_value(m: torch.Tensor, q: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """The smallest top-k survivor value whose mass strictly above passes
    ``float64(above) < limit``. m: (r, V) int32 low 31 bits of the values; q: (r, V)
    int64 masses (0 off the survivors); limit: (r,) float64 ``top_p * Z`` with
    ``top_p < 1``. Returns (r,) float32. A value below every survivor has all of ``Z``
    above it, which never passes (``float64(Z) < top_p * float64(Z)`` is false), so the
    top-k casualties need no exclusion.

    Level 1 bins the whole rows by ``m >> 20``; the next two bin only the elements of
    the chosen bin, by the next 10 and the last 10 bits (there one bin is one value)."""
    r = m.shape[0]
    hi = m >> _HI_SHIFT
    flat = (hi + (torch.arange(r, dtype=torch.int32, device=m.device) * _HI_BINS).unsqueeze(1))
    mass = torch.zeros(r * _HI_BINS, dtype=torch.int64, device=m.device)
    mass.index_add_(0, flat.flatten(), q.flatten())
    mass = mass.view(r, _HI_BINS)
    above = mass.cumsum(-1).sub_(mass)
    b = _last_passing(above, limit)
    base = above.gather(1, b.unsqueeze(1)).squeeze(1)  # mass above bin b
    ri, ci = (hi == b.to(torch.int32).unsqueeze(1)).nonzero(as_tuple=True)
    mm, qq = m[ri, ci], q[ri, ci]
    value = b << _HI_SHIFT
    for shift, mask in _LEVELS:  # over the chosen bin's elements only
        digit = ((mm >> shift) & mask).to(torch.int64)
        mass = torch.zeros(r * (mask + 1), dtype=torch.int64, device=m.device)
        mass.index_add_(0, ri * (mask + 1) + digit, qq)
        mass = mass.view(r, mask + 1)
        above = mass.cumsum(-1).sub_(mass).add_(base.unsqueeze(1))
        d = _last_passing(above, limit)
        base = above.gather(1, d.unsqueeze(1)).squeeze(1)
        value = value | (d << shift)
        keep = digit == d[ri]
        ri, mm, qq = ri[keep], mm[keep], qq[keep]
    mstar = value.to(torch.int32)
    sign = torch.where(mstar == 0, 0, -(2 ** 31)).to(torch.int32)
    return (mstar | sign).view(torch.float32)


def _last_passing(above: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """(r,) int64 index of the last bin whose mass above passes the limit. ``above`` never
    decreases along a row, so the passing bins are a prefix. The last one is never
    empty: an empty bin has the mass above the next nonempty bin (or all of ``Z``, which
    fails), so when it passes, so does that bin. The first bin always passes (nothing is
    above the row's largest value)."""
    return passing_prefix(above, limit.unsqueeze(1)) - 1
