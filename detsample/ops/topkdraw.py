"""Steps 7-10 of a batch of small top-k rows in one numba pass per row: the sampler's
shortcut for its commonest request (top-k with or without top-p / min-p, "raw"
logprobs) on a CPU, where the general path's ~90 small torch operations cost more
than the row's arithmetic at small batches (docs/performance.md, "Sampler").

The torch-composed steps stay the reference: :func:`draw` gives their bits -- the same
candidates (``ops.select``), scaled values, masses, kept prefix (``ops.filters.
kept_prefix``), id-order CDF and draw (``ops.draw``), and logprob (``arith.picked``)
-- or None where it does not run, and the sampler then takes the general path. The
semantics are written once, in :mod:`detsample.rules` and the ops above; the kernel
(:mod:`detsample.ops.topkdrawjit`) spells them for one row, and tests/ops/
test_topkdraw.py holds it to the torch path bit for bit (hypothesis: random batches,
ties at every boundary, -inf entries, huge magnitudes, NaN / +inf rows).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from detsample import rules
from detsample.ops import draw as draw_ops


@functools.cache
def _kernels():
    from detsample.ops import topkdrawjit

    return topkdrawjit


@functools.cache
def _cpu():
    from detsample.arith import cpu

    return cpu


@dataclass(frozen=True)
class SmallTopK:
    """The per-row parameters of a batch of B small top-k rows, as the kernel reads them.

    K: the candidates (``min(k_max + 1, V)``); k_index: (B,) int64 each row's top-k
    boundary among them (``min(top_k, k_max) - 1``); temperatures: (B,) float32 > 0;
    top_p: (B,) float64, ``+inf`` where disabled; least: (B,) float32 the smallest exp
    the element-wise filters keep (``-inf``: none active); frac: the masses' fraction
    bits (``rules.frac_bits(V)``)."""

    K: int
    k_index: np.ndarray
    temperatures: np.ndarray
    top_p: np.ndarray
    least: np.ndarray
    frac: int

    @staticmethod
    def of(
        V: int,
        K: int,
        k_index: torch.Tensor,
        temperatures: torch.Tensor,
        top_p: torch.Tensor | None,
        element: torch.Tensor,
    ) -> SmallTopK | None:
        """From the plan's tensors (rows of V tokens, K candidates): k_index (B, 1)
        int64, temperatures (B, 1) float32, top_p (B, 1) float64 (None: no row uses it),
        element (B, F) float32. None when a registered element-wise filter is not a
        ``least`` test (the kernel knows no other)."""
        least = draw_ops.least_kept(element)
        if least is None:
            return None
        B = k_index.shape[0]
        tp = np.full(B, np.inf) if top_p is None else top_p.reshape(-1).to(torch.float64).numpy().copy()
        return SmallTopK(
            int(K),
            k_index.reshape(-1).to(torch.int64).numpy().copy(),
            temperatures.reshape(-1).to(torch.float32).numpy().copy(),
            tp,
            least.numpy().copy(),
            rules.frac_bits(V),
        )


#: no known maxima (the kernel finds each row's own)
_NO_MAX = np.empty(0, dtype=np.float32)


@dataclass(frozen=True)
class Drawn:
    """:func:`draw`'s rows (B of them): tokens (B,) int64, logprobs (B,) float32 ("raw"),
    and, as numpy arrays, tau (B,) float32 the kept threshold and total (B,) int64 the
    exact kept mass (the general path's ``KeptCDF.tau`` / ``.total``)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    tau: np.ndarray
    total: np.ndarray


def draw(x: torch.Tensor, rows: SmallTopK, u: torch.Tensor, *, deterministic: bool = True) -> Drawn | None:
    """Each row's drawn token and its "raw" logprob, bit for bit the general path's.

    x: (B, V) float32 CPU logits, steps 1-5 having changed nothing; rows: their
    :class:`SmallTopK`; u: (B,) float64 the rows' uniforms (``rng.row_uniforms``).
    ``deterministic``: the deterministic mode's check that no tie group at a row's k-th
    value spills past the candidates (the fast mode reads the first K alone, as its
    general path does). Returns a :class:`Drawn`, or None when a row needs the
    general path: a NaN, a +inf or no finite value (sanitised there), a tie group
    spilling past the candidates (grown there). Needs numba (the caller checks
    ``rules.fused_masses``)."""
    cpu = _cpu()
    B, V = x.shape
    a = cpu.rows_view(x)
    out = (np.empty(B, np.int64), np.empty(B, np.float32), np.empty(B, np.float32), np.empty(B, np.int64))
    status = np.empty(B, np.int8)
    if cpu.column_parts(B, V) > 1:  # a long row of a small batch: its normaliser split
        m, g = (t.numpy() for t in cpu.normalisers(x))
    else:
        m, g = _NO_MAX, np.full(B, np.nan)
    k = _kernels()
    uu = u.numpy() if u.dtype == torch.float64 else u.to(torch.float64).numpy()
    params = (rows.K, rows.k_index, rows.temperatures, rows.top_p, rows.least, rows.frac, deterministic)
    cpu.split_rows(lambda s, e: k.draw_rows(a, params, (uu, m, g), (*out, status), (s, e)), B, a.size)
    if status.any():
        return None
    return Drawn(torch.from_numpy(out[0]), torch.from_numpy(out[1]), out[2], out[3])


def applies(x: torch.Tensor) -> bool:
    """Whether :func:`draw` runs on ``x``: a (B, V) float32 CPU tensor with B, V >= 1,
    not requiring grad, where numba runs."""
    return x.dim() == 2 and x.shape[0] > 0 and x.shape[1] > 0 and not x.requires_grad and rules.fused_masses(x)
