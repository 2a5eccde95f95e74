"""Step 8's candidates of a top-p row, found by value: the elements above a lower bound
of its threshold, without a ``topk`` or a sort of the row.

A top-p row keeps ``{z_i >= tau}``, where ``tau`` is the smallest value whose top-k
survivors' mass strictly above it, ``A(tau)``, passes ``float64(A) < top_p * Z``
(:mod:`detsample.rules`). Any value ``L`` with ``float64(A(L)) >= top_p * Z`` is therefore
below ``tau``, and ``{z_i > L}`` is an upper set holding the whole kept set: candidates
for :func:`~detsample.ops.filters.kept_prefix`, the one kept-set function.

``L`` comes from the row's column-group maxima: column ``j`` of a row and the columns
``j + W, j + 2W, ...`` (``W = V // GROUP``) form one group; every group maximum is an
element of the row, so the survivors' mass strictly above a value is at least the mass of
the group maxima above it (:func:`group_maxima`). The maxima's masses are summed in bins
of their float32 bits (:func:`lower_bound`, exact integer sums), and ``L`` is the
largest value of the first bin whose maxima mass above reaches the limit: one pass over
the row for the maxima, then work on ``V / GROUP`` values. :func:`above` gathers the
candidates ``z > L`` (a mask, then the few survivors, sorted by value).

Nothing here is a result: the caller checks that the candidates' own mass fails the
limit (the property that makes them hold the kept set), and a row whose maxima never
reach the limit (a flat distribution: its nucleus spans most of the vocabulary) is left
to the full strategy. Every sum is an exact integer and every comparison is the rule's,
so each row's candidates are a function of that row alone (bitwise batch-invariant).
"""

from __future__ import annotations

import torch

from detsample import rules
from detsample.ops import rowpass
from detsample.ops.filters import passing_prefix

#: a row's columns fall into groups of GROUP, strided by ``V // GROUP``
GROUP = 8
#: the maxima are binned by the low 31 bits of their float32 pattern shifted right by
#: BIN_SHIFT: the exponent and 5 mantissa bits (a bin spans 1/32 of a value's magnitude),
#: magnitudes below 2**-10 sharing the first bin and those from 2**8 on (a mass below
#: exp(-256): 0) the last; any binning ordered by value gives a valid bound
BIN_SHIFT = 18
KEY_LO = (127 - 10) << (23 - BIN_SHIFT)
KEY_HI = (127 + 8) << (23 - BIN_SHIFT)
BINS = KEY_HI - KEY_LO + 1
_SIGN = -(2**31)


def group_maxima(z: torch.Tensor) -> torch.Tensor:
    """The maxima of each row's strided column groups.

    z: (rows, V) float32. Returns (rows, W + V % GROUP) float32 with ``W = V // GROUP``:
    entry ``j < W`` is the largest of columns ``j, j + W, ..., j + (GROUP - 1) W``, the
    others are the last ``V % GROUP`` columns themselves. Each entry is an element of its
    row (``amax`` selects, it does not compute)."""
    return _fold(z, torch.amax)


def _fold(t: torch.Tensor, reduce) -> torch.Tensor:
    """``reduce`` (``torch.amax`` or ``torch.sum``) over each row's strided groups of
    ``GROUP`` columns (see :func:`group_maxima`), the last ``V % GROUP`` columns kept
    as they are: (rows, V) -> (rows, V // GROUP + V % GROUP). Each output reduces at
    most ``GROUP`` inputs."""
    rows, V = t.shape
    W = V // GROUP
    parts = [reduce(t[:, : GROUP * W].unflatten(1, (GROUP, W)), 1)] if W else []
    if V > GROUP * W:
        parts.append(t[:, GROUP * W :])
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def lower_bound(
    maxima: torch.Tensor, thr: torch.Tensor | None, limit: torch.Tensor, frac: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A value below each row's top-p threshold, from its group maxima.

    maxima: (rows, m) float32 from :func:`group_maxima` of max-shifted scaled logits
    (every value ``<= 0`` or ``-inf``); thr: (rows, 1) float32 top-k threshold value
    (``-inf``: none) or None; limit: (rows,) float64 ``top_p * Z``
    (:func:`detsample.rules.top_p_limit`); frac: fixed-point bits. Returns ``(L, found)``:
    (rows,) float32 and (rows,) bool. Where ``found``, the survivors among the maxima
    strictly above ``L`` (a lower bound of the row's survivors' mass strictly above
    ``L``) have a mass that fails the top-p test, so ``L < tau``; elsewhere ``L`` is
    meaningless (the maxima's whole mass passes)."""
    fused = rowpass.lower_bound(maxima, thr, limit, frac, (BIN_SHIFT, KEY_LO, KEY_HI))
    if fused is not None:  # one pass per row on a CPU, the same bits
        return fused
    rows = maxima.shape[0]
    # (a top-k casualty carries no survivor mass)
    q = rules.mass_in_place(rules.floored_exp(maxima, keep_from=None if thr is None else thr.squeeze(1)), frac)
    # larger value, smaller key: the low 31 bits of a value <= 0 grow with its magnitude
    key = (maxima.view(torch.int32) & 0x7FFFFFFF).bitwise_right_shift_(BIN_SHIFT)
    key = key.clamp_(KEY_LO, KEY_HI).to(torch.int64).sub_(KEY_LO)
    hist = torch.zeros(rows, BINS, dtype=torch.int64, device=maxima.device)
    hist.scatter_add_(1, key, q)  # row-wise: parallel over the rows
    above = hist.cumsum(-1).sub_(hist)  # the maxima mass strictly above each bin's values
    b = passing_prefix(above, limit.unsqueeze(1))  # the first bin that fails
    found = b < BINS
    # the largest value of bin b (b >= 1: the first bin, above nothing, always passes)
    bits = ((b.clamp(max=BINS - 1) + KEY_LO) << BIN_SHIFT) + _SIGN
    return bits.to(torch.int32).view(torch.float32), found


def mass_bounds(z: torch.Tensor, frac: int, *, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Integers bracketing each row's exact mass ``Z = sum_i trunc(exp(z_i) * 2**frac)``
    without the int64 pass: ``lo <= Z <= hi``.

    z: (rows, V) float32 (values ``<= 0`` or ``-inf``); ``out``: an optional (rows, V)
    float32 scratch. Returns (rows,) int64 ``lo`` and ``hi``. The exps are the rule's
    (:func:`detsample.rules.floored_exp`: the floor spares subnormal results, ~24x
    slower, and changes no mass); their strided groups of ``GROUP`` are summed in float32, twice
    (``GROUP - 1`` additions in whatever order the library takes: at most ``(GROUP - 1)
    u / (1 - (GROUP - 1) u)`` relative error each time, ``u = 2**-24``), the remaining
    ``m`` sums in float64 (at most ``(m - 1) 2**-53 / (1 - ...)``), and each truncation
    takes less than 1. These are bounds of any summation order, so the
    bracket holds whatever kernels run; it is about ``1e-6`` of ``Z`` wide."""
    rows, V = z.shape
    g = _fold(_fold(rules.floored_exp(z, out=out), torch.sum), torch.sum)
    s = g.sum(-1, dtype=torch.float64) * rules.mass_scale(frac)  # exact scaling
    u32, u64 = 2.0**-24, 2.0**-53
    g7 = _gamma(GROUP - 1, u32)
    rel = (1 + g7) ** 2 * (1 + _gamma(g.shape[1] - 1, u64)) - 1
    # S / (1 + rel) >= s (1 - 2 rel) and S / (1 - rel) <= s (1 + 2 rel) (rel < 1/2), with
    # one more unit for the bound's own float64 roundings
    lo = torch.floor(s * (1 - 2 * rel) - V - 1).clamp_(min=0)
    hi = torch.ceil(s * (1 + 2 * rel) + 1)
    return lo.to(torch.int64), hi.to(torch.int64)


def _gamma(n: int, u: float) -> float:
    """``n u / (1 - n u)``: the relative error bound of a sum of ``n + 1`` non-negative
    terms in any order, rounding to nearest with unit roundoff ``u``."""
    return n * u / (1 - n * u)


def above(z: torch.Tensor, L: torch.Tensor, maxima: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The elements of each row strictly above its bound, sorted by value.

    z: (rows, V) float32; L: (rows,) float32; maxima: (rows, m) :func:`group_maxima`
    of ``z``. Only the groups whose maximum is above ``L`` hold such elements, so only
    their members are read. Returns ``(vals, ids)``, both (rows, C) with C the largest
    count: each row's values ``z > L`` descending, then ``-inf``, and their column ids,
    then ``rules.PAD_ID`` (the order inside a group of equal values is unspecified:
    every consumer reads whole tie groups)."""
    rows, V = z.shape
    W, dev = V // GROUP, z.device
    gr, gj = (maxima > L.unsqueeze(1)).nonzero(as_tuple=True)
    base = gr * V + gj  # the flat index of each group's first member
    members = base.unsqueeze(1) + torch.arange(GROUP, device=dev) * W  # (n, GROUP)
    tail = gj >= W if V > GROUP * W else None  # a last column of its own: member 0 only
    if tail is not None:
        members = torch.where(tail.unsqueeze(1), (base + (GROUP - 1) * W).unsqueeze(1), members)
    vals = torch.take(z, members)
    keep = vals > L[gr].unsqueeze(1)
    if tail is not None:
        keep[:, 1:] &= ~tail.unsqueeze(1)
    f = keep.view(-1).nonzero().squeeze(1)  # ascending: row-major
    r = gr[f // GROUP]
    count = torch.bincount(r, minlength=rows)
    width = max(int(count.max()), 1) if r.numel() else 1
    pos = torch.arange(r.numel(), device=dev) - (count.cumsum(0) - count)[r]
    out_v = torch.full((rows, width), float("-inf"), dtype=z.dtype, device=dev)
    out_i = torch.full((rows, width), rules.PAD_ID, dtype=torch.int64, device=dev)
    flat = r * width + pos
    out_v.view(-1)[flat] = vals.view(-1)[f]
    out_i.view(-1)[flat] = members.view(-1)[f] - r * V
    return _by_value_desc(out_v, out_i)


def _by_value_desc(vals: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(vals, ids) (rows, C) reordered by value descending (values <= 0 or -inf): by
    their ascending low 31 bits (an int32 sort takes about 2/3 of a float32 one)."""
    order = torch.sort(vals.view(torch.int32) & 0x7FFFFFFF, dim=-1)[1]
    return vals.gather(1, order), ids.gather(1, order)
