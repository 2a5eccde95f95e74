"""Pipeline step 10: logprobs, always through :func:`log_softmax` (never ``log(softmax)``).

:func:`log_softmax` is the one entry point of every logprob the Sampler returns, and
its bits are defined by detsample (:mod:`detsample.arith`: its own ``exp``, an exact
fixed-point sum and its own ``log``), not by a platform's kernels: a row gets the same
bits at every batch size, thread count, CPU (x86 of any ISA and MKL path, aarch64) and
torch build, so the sampling path and the rescoring path (``Sampler.compute_logprobs``)
agree bitwise everywhere. It gives the same values at one entry
per row (``at=``) for the cost of one pass (no (rows, V) output).
The "processed" mode is the log of the final filtered, renormalised distribution:
``z_i - log(Q * 2**-F)`` with the exact fixed-point kept mass ``Q`` of the draw, i.e. a
log_softmax over the kept set whose normaliser is an exact (order-free) sum.
"""

from __future__ import annotations

import torch

from detsample import arith
from detsample.ops import select

NEG_INF = float("-inf")


def log_softmax(
    x: torch.Tensor,
    *,
    kept_mass: torch.Tensor | None = None,
    frac: int = 0,
    out: torch.Tensor | None = None,
    at: torch.Tensor | None = None,
    norm: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """THE log_softmax of detsample: every logprob it returns (the sampled token's, the
    top-n, the rescoring path's, in every ``logprobs_mode``) is computed here, so a
    kernel swapped in this one place changes all of them together.

    x: (rows, n) float32 logits (n = vocab, or picked tokens when ``kept_mass`` is given).

    * ``kept_mass`` None: :func:`detsample.arith.log_softmax` over the last dimension
      (``float32((x - max) - log(S))`` in float64 with ``S`` the exact sum of detsample's
      exps: within 1 ulp of the float64 log_softmax; NaN32 for a row with a NaN, a +inf
      or no finite value), written into ``out`` (a (rows, n) float32 buffer) when given.
    * ``kept_mass`` (int64, broadcastable to ``x``, >= 1): the "processed" normaliser, the
      exact fixed-point mass ``Q`` of the kept set (``frac`` fraction bits):
      ``float32(float64(x) - log(float64(Q) * 2**-frac))`` with ``x`` scaled logits (row
      max 0) and detsample's ``log``. Bitwise identical whichever draw path produced
      ``Q`` (it is exact). The power-of-two scaling is exact, so a token carrying all the
      kept mass (``Q == 2**frac``, ``x == 0``) gets exactly 0.
    * ``at`` (rows,) int64 token ids in range (with ``kept_mass`` None): only the values
      at ``x[i, at[i]]``, (rows,) float32, the same bits, from the rows' normalisers
      (:func:`detsample.arith.normalisers`): one pass over ``x``, no (rows, n) output;
      ``norm``: those normalisers ``(m, G)`` when computed already (then no pass).
    """
    if kept_mass is None and at is not None:
        if norm is None:
            return arith.log_softmax_at(x, at)
        return arith.picked(gather_rows(x, at), *norm)
    if kept_mass is None:
        return arith.log_softmax(x, out=out)
    norm = arith.log64(kept_mass.to(torch.float64) * (2.0**-frac))
    return (x.to(torch.float64) - norm).to(torch.float32)


def row_normalisers(x: torch.Tensor, m: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' ``(max, log-normaliser)`` of :func:`log_softmax` (``norm=``), one pass:
    x (rows, n) float32, m (rows,) its maxima when known (:func:`detsample.arith.normalisers`)."""
    return arith.normalisers(x, m)


def processed_log_softmax(x: torch.Tensor, temperature: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """vLLM's "processed" logprobs: ``log_softmax`` over the kept set of the logits
    divided by the temperature, -inf elsewhere (vLLM's sampler: ``logits.div_(temp)``,
    top-k / top-p masked to ``-inf``, ``logits.log_softmax(-1)``).

    x: (rows, V) float32 logits (before temperature); temperature: (rows, 1) float32
    (> 0); keep: (rows, V) bool, the kept set. Returns (rows, V) float32. The division is
    correctly rounded per element and :func:`log_softmax` is row-invariant, so a row gets
    the same bits at every batch size and thread count; the bits equal vLLM's formula on
    the same logits and kept set (tests/ops/test_logprobs.py re-implements vLLM's code
    path). It differs from the fixed-point form (``kept_mass``) by a few ulps: the
    normaliser here is a float logsumexp of ``x / T``, there the exact kept mass of
    ``(x - max) / T``.
    """
    return log_softmax((x / temperature).masked_fill(~keep, NEG_INF))


def gather_rows(values: torch.Tensor, token_ids: torch.Tensor, *, in_range: bool = False) -> torch.Tensor:
    """values: (batch, vocab); token_ids: (batch,) int64 -> (batch,) picked values.

    ``in_range``: the caller guarantees ``0 <= token_ids < vocab`` (an argmax, a drawn
    token); a single row then costs one ``take`` instead of three operator calls (the
    same value; ``take`` would wrap a negative id where ``gather`` raises, hence the
    flag)."""
    if in_range and values.shape[0] == 1:
        return torch.take(values, token_ids)
    return values.gather(1, token_ids.unsqueeze(1)).squeeze(1)


def topn(values: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``n`` largest entries per row, ordered by (value desc, token id asc).

    values: (batch, vocab) float32 without NaN. Returns ((batch, n) float32,
    (batch, n) int64). Deterministic on ties: a bounded ``topk`` decides the set when
    the n-th value is not tied beyond n entries; other rows use a full stable sort.
    Both give the same result (tested), so the choice never changes a row's output.
    """
    B = values.shape[0]
    if n == 0 or B == 0:
        return (values.new_empty((B, 0)), torch.empty((B, 0), dtype=torch.int64, device=values.device))
    V = values.shape[-1]
    got = select.stable_topk(values, n)
    if got is not None:  # the stable sort's prefix already
        return got
    vals, ids = torch.topk(values, min(n + 1, V), dim=-1, largest=True, sorted=True)
    # the set is exact unless the (n+1)-th largest value ties the n-th
    exact = vals[:, n] < vals[:, n - 1] if n < V else torch.ones(B, dtype=torch.bool, device=values.device)
    vals, ids = vals[:, :n], ids[:, :n]
    # order the candidate set by (value desc, id asc): sort ids, then a stable value sort
    sid, order = torch.sort(ids, dim=-1)
    sval = vals.gather(1, order)
    sval2, order2 = torch.sort(sval, dim=-1, descending=True, stable=True)
    out_v, out_i = sval2, sid.gather(1, order2)
    if not bool(exact.all()):
        rows = (~exact).nonzero().flatten()
        fv, fi = torch.sort(values.index_select(0, rows), dim=-1, descending=True, stable=True)
        out_v = out_v.index_copy(0, rows, fv[:, :n].contiguous())
        out_i = out_i.index_copy(0, rows, fi[:, :n].contiguous())
    return out_v, out_i
