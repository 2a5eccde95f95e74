"""Pipeline steps 7-9 over a row's known finite columns (a grammar row's allowed tokens).

A grammar-masked row is ``-inf`` outside its allowed columns, and a ``-inf`` logit has
no mass: its scaled logit is ``-inf``, its fixed-point mass ``q`` is 0 and it never
holds the target of the inverse CDF. So the draw of such a row over its allowed columns
alone -- the same element-wise arithmetic of steps 7 and 8 (``z = (x - max) / T``,
``q = trunc(exp(max(z, EXP_FLOOR)) * 2**F)``, :mod:`detsample.rules`, the element-wise
filters) on those columns, then the exact
running sum in token-id order -- gives the same kept mass ``Q`` and the same token as the
pass over the whole vocabulary (:func:`detsample.ops.draw.block_cdf` and
:func:`~detsample.ops.draw.draw_by_blocks`), at the cost of the allowed columns instead
of V. It applies to rows without a top-k or top-p (their threshold search ranks values
across the row); the table it returns is the compact CDF table that
:func:`~detsample.ops.draw.draw_by_cdf` reads.

Guarantee: bitwise the full-vocabulary result (every operation is element-wise IEEE
arithmetic, torch's ``exp``, or an exact integer sum; tests/ops/test_colcdf.py), and
row-local, hence bitwise batch-invariant.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from detsample.ops.filters import CandidateCut, kept_prefix
from detsample.ops.temperature import scale_logits
from detsample.rules import PAD_ID, element_active

_NEG_INF = float("-inf")


def gather_columns(
    x: torch.Tensor,
    rows: Sequence[int],
    columns: Sequence[np.ndarray],
    known: Sequence[np.ndarray | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The values of ``x`` at each row's columns, padded to one width.

    x: (B, V) float32 CPU contiguous; rows: n row indices; columns: n int64 arrays of
    ascending distinct column ids < V (may be empty); known: per row, None or the
    float32 values ``x[rows[i], columns[i]]`` already read (taken as they are: the
    caller vouches for them). Returns ``(vals, ids)``, both (n, K) with K the longest
    list (at least 1): ``vals[i, j] = x[rows[i], columns[i][j]]`` then ``-inf``, ``ids``
    the column ids then ``PAD_ID`` (larger than any token).
    """
    xs = x.numpy()
    n = len(rows)
    k = max(max((c.size for c in columns), default=0), 1)
    vals = np.empty((n, k), dtype=np.float32)
    ids = np.empty((n, k), dtype=np.int64)
    groups: dict[int, tuple[np.ndarray, list[int]]] = {}  # rows sharing one column array
    for i, c in enumerate(columns):  # (rows in one grammar state share it)
        got = None if known is None else known[i]
        if got is None:
            groups.setdefault(id(c), (c, []))[1].append(i)
            continue
        s = c.size
        vals[i, :s] = got
        ids[i, :s] = c
        if s < k:
            vals[i, s:] = _NEG_INF
            ids[i, s:] = PAD_ID
    for c, pos in groups.values():
        s = c.size
        src = [rows[i] for i in pos]
        whole = len(pos) == n and src == list(range(xs.shape[0]))  # every row, in order
        vals[pos, :s] = np.take(xs, c, axis=1) if whole else xs[np.ix_(src, c)]
        ids[pos, :s] = c
        if s < k:
            vals[pos, s:] = _NEG_INF
            ids[pos, s:] = PAD_ID
    return torch.from_numpy(vals), torch.from_numpy(ids)


def column_cdf(
    vals: torch.Tensor,
    ids: torch.Tensor,
    shift: torch.Tensor,
    temperatures: torch.Tensor,
    element: torch.Tensor,
    frac: int,
    *,
    cut_element: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The compact CDF table of rows drawn over their finite columns (no top-k/top-p).

    vals, ids: (n, K) from :func:`gather_columns` (every finite logit of each row is
    among its columns); shift: (n, 1) float32, the row maxima that step 7 subtracts;
    temperatures: (n, 1) float32 > 0; element: (n, F) float32 the element-wise filters'
    parameters (:data:`detsample.rules.ELEMENT_FILTERS`); frac: fixed-point bits;
    ``cut_element``: whether some element-wise filter is active, when the caller knows
    (None: look). The kept set is the one function of the candidates,
    :func:`~detsample.ops.filters.kept_prefix` (here the element-wise filters only: any
    order). Returns
    ``(ids, csum)``: the ids unchanged and the (n, K) int64 running kept mass in id
    order (a dropped column adds 0, so the draw never lands on it), ``csum[:, -1]`` the
    exact kept mass ``Q``: the token, ``Q`` and (``-inf``) threshold of the
    full-vocabulary path bit for bit.
    """
    z = scale_logits(vals, shift, temperatures)
    use = bool(element_active(element).any()) if cut_element is None else cut_element
    cut = CandidateCut(element=element.to(torch.float32) if use else None)
    _, kept, q, _ = kept_prefix(z, cut, frac)
    return ids, (q.mul_(kept) if use else q).cumsum_(-1)
