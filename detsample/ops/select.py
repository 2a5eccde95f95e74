"""The K largest values of each row: THE ``topk`` of the sampler's candidate sets
(``ops.filters.logit_topk``, ``sampling.keptset``) and of the top logprobs
(``ops.logprobs.topn``).

On a float32 CPU tensor where numba runs, :func:`stable_topk` gives the prefix of a
stable descending sort -- the K entries first in the order (value descending, id
ascending), bit for bit, ties included -- from one pass over the row and a heap of K
(:mod:`detsample.ops.selectjit`): 3x faster than ``torch.topk`` on one thread
(docs/architecture.md), and no torch parallel region (whose OpenMP workers spin for
milliseconds on the cores the next numba kernels want). Elsewhere, and for a row holding
a NaN, :func:`topk` is ``torch.topk``: the same values, the ids the same up to the order
(and, at the K-th value, the choice) inside a group of equal values -- which every
consumer of :func:`topk` reads whole (tests/ops/test_select.py holds the kernel to a
stable sort).
"""

from __future__ import annotations

import functools

import torch

from detsample import rules


@functools.cache
def _kernels():
    from detsample.ops import selectjit

    return selectjit


def stable_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The first ``min(k, n)`` entries of each row of ``x`` (rows, n) float32 in the
    order (value desc, id asc): ((rows, k) float32 values, (rows, k) int64 ids), exactly
    ``torch.sort(x, descending=True, stable=True)``'s prefix. None where the kernel does
    not run (not a float32 CPU tensor, no numba, a row holding a NaN, k < 1, rows of
    length 0)."""
    if not rules.fused_masses(x) or x.dim() != 2 or k < 1 or x.shape[1] == 0 or x.requires_grad:
        return None
    from detsample.arith import cpu

    rows, n = x.shape
    k = min(k, n)
    a = cpu.rows_view(x)
    vals = torch.empty((rows, k), dtype=torch.float32)
    ids = torch.empty((rows, k), dtype=torch.int64)
    nan = torch.empty(rows, dtype=torch.int8)
    out = (vals.numpy(), ids.numpy(), nan.numpy())
    kern = _kernels().topk_rows
    cpu.split_rows(lambda s, e: kern(a, k, out, (s, e)), rows, x.numel())
    if bool(out[2].any()):
        return None
    return vals, ids


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``min(k, n)`` largest values of each row of ``x`` (rows, n), descending, and
    their ids: :func:`stable_topk` where it runs, else ``torch.topk`` (the same values;
    ids up to the order and choice inside a group of equal values)."""
    got = stable_topk(x, k)
    if got is not None:
        return got
    return torch.topk(x, min(k, x.shape[-1]), dim=-1, largest=True, sorted=True)
