"""The mode's row sums: torch's serial loop where verified, or the fixed tree.

:func:`row_sum` is what every reduction kernel of the mode (``sum``, ``mean``, the
softmax denominators, layer norm's moments) sums with:

* ``portable=True``: :func:`detsample.invariant.tree.tree_sum`, one fixed order of IEEE
  additions per row;
* ``portable=False``: rows of at most :data:`~detsample.invariant.verify.SUM_CHUNK`
  columns by torch's ``sum`` in calls below its threading grain, where the on-machine
  check (:func:`~detsample.invariant.verify.sum_plan`) found a row's bits independent of
  the call's other rows and of the thread count; else the fixed tree. Longer rows are
  summed in column chunks from column 0, then the chunk sums are summed the same way.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from detsample.invariant.state import note_portable
from detsample.invariant.tree import tree_sum
from detsample.invariant.verify import SUM_CHUNK, sum_plan, torch_row_sum
from detsample.probe.threads import torch_threads


def row_sum(x: torch.Tensor, portable: bool) -> torch.Tensor:
    """Sums ``(R, N) -> (R,)`` of a floating tensor in its dtype. Guarantee: row r's bits
    depend on ``x[r]`` only (with ``portable``, on its values alone, on any machine)."""
    x = x.contiguous()
    r, n = x.shape
    if r == 0:
        return x.new_empty((0,))
    if portable:
        note_portable(("sum", n, x.dtype, "portable"), "fixed-tree sum")
        return tree_sum(x)
    if n > SUM_CHUNK:
        parts = [row_sum(x[:, c : c + SUM_CHUNK], portable) for c in range(0, n, SUM_CHUNK)]
        return row_sum(torch.stack(parts, dim=1), portable)
    if n == 0:
        return x.new_zeros((r,))
    plan = sum_plan(n, x.dtype)
    if plan.portable:
        return tree_sum(x)
    with torch_threads(1) if plan.data[0] else nullcontext():
        return torch_row_sum(x)
