"""The sampler's full-row CPU passes as numba kernels (:mod:`detsample.ops.rowjit`): the
twins, for speed, of torch compositions in :mod:`detsample.ops.temperature` and
:mod:`detsample.ops.nucleus`, bit for bit (tests/ops/test_rowpass.py).

Each function returns None where its kernel does not run (not a float32 CPU tensor, or
no numba), and the caller takes its torch composition; with a kernel, every element's
or row's result is the same IEEE operations (or exact integers), so nothing but the time
changes. Rows are split over ``torch.get_num_threads()`` threads (a row is one thread's).
Measured (docs/performance.md, "Fused CPU passes"): ``scale_logits`` one pass for two,
the top-p rows' exact mass and group maxima in one pass, the maxima's bound without ten
tensor passes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from detsample import rules


@functools.cache
def _kernels():
    from detsample.ops import rowjit

    return rowjit


def runs(t: torch.Tensor) -> bool:
    """Whether the kernels run on ``t`` (a float32 CPU tensor, numba importable)."""
    return rules.fused_masses(t)


def _split(fn, rows: int, elements: int) -> None:
    from detsample.arith import cpu

    cpu.split_rows(fn, rows, elements)


def scale(x: torch.Tensor, m: torch.Tensor, t: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor | None:
    """``ops.temperature.scale_logits`` in one pass: x (B, V) float32, m (B, 1), t (B, 1)
    float32, out a contiguous (B, V) float32 buffer or None. None where no kernel runs."""
    if not (runs(x) and x.is_contiguous() and (out is None or out.is_contiguous())):
        return None
    z = torch.empty_like(x) if out is None else out
    a, zo = x.numpy(), z.numpy()
    mv, tv = m.reshape(-1).contiguous().numpy(), t.reshape(-1).contiguous().numpy()
    k = _kernels().scale_rows
    _split(lambda s, e: k(a, mv, tv, zo, s, e), x.shape[0], x.numel())
    return z


def mass_and_maxima(
    z: torch.Tensor, thr: torch.Tensor | None, frac: int, group: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The exact survivor mass (``filters.survivor_mass``) and the strided group maxima
    (``nucleus.group_maxima``) of z (rows, V) float32 in one pass: ((rows,) int64,
    (rows, V // group + V % group) float32). None where no kernel runs (its groups are
    of 8)."""
    if not (runs(z) and z.is_contiguous() and group == 8):
        return None
    rows, V = z.shape
    totals = torch.empty(rows, dtype=torch.int64)
    maxima = torch.empty((rows, V // group + V % group), dtype=torch.float32)
    t = (torch.full((rows,), -float("inf")) if thr is None else thr.reshape(-1)).contiguous()
    a, tv, to, mo = z.numpy(), t.to(torch.float32).numpy(), totals.numpy(), maxima.numpy()
    k = _kernels().mass_and_maxima_rows
    floor = rules.EXP_FLOOR
    _split(lambda s, e: k(a, tv, (_f32(floor), frac), (to, mo), (s, e)), rows, z.numel())
    return totals, maxima


def lower_bound(
    maxima: torch.Tensor, thr: torch.Tensor | None, limit: torch.Tensor, frac: int, keys: tuple[int, int, int]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``nucleus.lower_bound`` in one pass per row: ``keys`` = (shift, key_lo, key_hi) of
    its bins. Returns ((rows,) float32 bound, (rows,) bool found), or None where no
    kernel runs."""
    if not (runs(maxima) and maxima.is_contiguous()):
        return None
    rows = maxima.shape[0]
    bits = torch.empty(rows, dtype=torch.int64)
    found = torch.empty(rows, dtype=torch.bool)
    t = (torch.full((rows,), -float("inf")) if thr is None else thr.reshape(-1)).contiguous()
    lim = limit.to(torch.float64).contiguous()
    a, tv, lv, bo, fo = (maxima.numpy(), t.to(torch.float32).numpy(), lim.numpy(), bits.numpy(), found.numpy())
    k = _kernels().lower_bound_rows
    consts = (_f32(rules.EXP_FLOOR), frac, *keys)
    _split(lambda s, e: k(a, tv, lv, consts, (bo, fo), (s, e)), rows, maxima.numel())
    return bits.to(torch.int32).view(torch.float32), found


def _f32(v: float):
    import numpy as np

    return np.float32(v)


@dataclass(frozen=True)
class FirstPass:
    """What :func:`first_pass` computed: ``z`` (B, V) float32 step 7's scaled logits;
    ``norm`` (B,) float64 the "raw" log-normalisers of the rows asked (NaN elsewhere);
    ``totals`` (B,) int64 and ``maxima`` (B, V // 8 + V % 8) float32 the exact mass and
    group maxima of the rows asked (unspecified elsewhere)."""

    z: torch.Tensor
    norm: torch.Tensor
    totals: torch.Tensor
    maxima: torch.Tensor


def first_pass(
    x: torch.Tensor,
    maxima_of: tuple[torch.Tensor, torch.Tensor],
    t: torch.Tensor,
    flags: torch.Tensor,
    out: torch.Tensor | None,
) -> FirstPass | None:
    """One pass over model logits ``x`` (B, V) float32 that steps 1-5 left unchanged:
    step 7's ``z = (x - shift) / t`` for every row, and per row as ``flags`` (B,) int8
    ask -- 1: the "raw" log-normaliser of ``x`` (:func:`detsample.arith.normalisers`,
    maximum ``raw_max``), 2: the exact mass and group maxima of ``z``
    (:func:`mass_and_maxima`, no top-k) -- each the same bits as its own pass. The row
    stays in cache across its parts, and the call's heavy work runs before any torch
    parallel region. ``maxima_of`` = (shift, raw_max), each (B, 1) float32; ``out``: a
    (B, V) float32 buffer for z. None where no kernel runs."""
    if not (runs(x) and x.is_contiguous() and (out is None or out.is_contiguous())):
        return None
    B, V = x.shape
    z = torch.empty_like(x) if out is None else out
    norm = torch.full((B,), float("nan"), dtype=torch.float64)
    totals = torch.zeros(B, dtype=torch.int64)
    maxima = torch.empty((B, V // 8 + V % 8), dtype=torch.float32)
    per_row = tuple(v.reshape(-1).to(torch.float32).contiguous().numpy() for v in (*maxima_of, t)) + (
        flags.to(torch.int8).contiguous().numpy(),
    )
    outs = (z.numpy(), norm.numpy(), totals.numpy(), maxima.numpy())
    consts = (_f32(rules.EXP_FLOOR), rules.frac_bits(V))
    k = _kernels().first_pass_rows
    _split(lambda s, e: k(x.numpy(), per_row, consts, outs, (s, e)), B, x.numel())
    return FirstPass(z, norm, totals, maxima)


@dataclass(frozen=True)
class LazyMasses:
    """The kept masses of a blocked table, not materialised: ``z`` (rows, V) float32 and
    the rows' cuts ``tau`` / ``least`` (rows,) float32 (-inf: none), ``frac`` fraction
    bits (``rules.cut_masses``'s arguments); a draw recomputes one block per row."""

    z: torch.Tensor
    tau: torch.Tensor
    least: torch.Tensor
    frac: int


def draw_blocks(masses: LazyMasses, bsum: torch.Tensor, target: torch.Tensor, block: int) -> torch.Tensor:
    """``ops.draw.draw_by_blocks`` over lazy masses: (rows,) int64 tokens, the first
    whose running mass exceeds ``target`` (rows,) int64, from the running block sums
    ``bsum`` (rows, nb) int64 of blocks of ``block`` columns."""
    rows = masses.z.shape[0]
    out = torch.empty(rows, dtype=torch.int64)
    a = masses.z.contiguous().numpy()
    cuts = (masses.tau.contiguous().numpy(), masses.least.contiguous().numpy())
    consts = (_f32(rules.EXP_FLOOR), masses.frac, block)
    b, t, o = bsum.contiguous().numpy(), target.contiguous().numpy(), out.numpy()
    k = _kernels().draw_blocks_rows
    _split(lambda s, e: k(a, cuts, consts, (b, t), o, (s, e)), rows, rows * block)
    return out
