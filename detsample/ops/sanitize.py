"""Pipeline step 2: non-finite sanitising (row-local)."""

from __future__ import annotations

import math

import torch

from detsample import arith
from detsample.rules import NAN_FLOOR, POSINF_CEIL, STATUS_HAD_NAN, STATUS_HAD_POSINF, STATUS_NO_VALID_TOKEN


def sanitize_rows_flagged(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """Replace NaN by ``NAN_FLOOR`` and +inf by ``POSINF_CEIL``; -inf stays (a mask).

    x: (batch, vocab) float32 (not modified). Returns ``(clean, status, row_max, finite)``:
    ``clean`` is ``x`` itself when every row is finite-or--inf (no copy), else a copy;
    ``status`` is (batch,) int32 of STATUS_* bit flags; ``row_max`` is (batch, 1) float32,
    the maximum of each clean row (-inf for a fully masked row). Only rows whose max is NaN or +inf are touched,
    so the result of a row depends on that row alone (bitwise batch-invariant).
    The fourth value is a host bool: True when every row maximum was finite (then
    ``clean is x`` and ``status`` is all zero: the common case costs four operations).
    """
    m = arith.row_max(x)  # propagates NaN (torch's amax, or numba threads on a CPU)
    status = torch.zeros(x.shape[0], dtype=torch.int32, device=x.device)
    if math.isfinite(float(m.sum())):  # the common case: nothing to fix, no masked row
        return x, status, m.unsqueeze(1), True  # (a finite sum: every maximum is finite)
    bad = torch.isnan(m) | torch.isposinf(m)
    if bool(bad.any()):
        rows = bad.nonzero().flatten()
        sub = x.index_select(0, rows)
        had_nan = torch.isnan(sub).any(dim=-1)
        had_inf = torch.isposinf(sub).any(dim=-1)
        fixed = torch.nan_to_num(sub, nan=NAN_FLOOR, posinf=POSINF_CEIL, neginf=float("-inf"))
        x = x.clone()
        x.index_copy_(0, rows, fixed)
        flag = had_nan.to(torch.int32) * STATUS_HAD_NAN + had_inf.to(torch.int32) * STATUS_HAD_POSINF
        status.index_copy_(0, rows, flag)
        m = m.clone()
        m.index_copy_(0, rows, torch.amax(fixed, dim=-1))
    status |= torch.isneginf(m).to(torch.int32) * STATUS_NO_VALID_TOKEN
    return x, status, m.unsqueeze(1), False
