"""Pipeline step 10: the chosen tokens' logprobs and the top-n logprobs, in each row's
``logprobs_mode`` ("raw", "scaled", "processed" -- vLLM's -- or "processed_fixed"),
from the steps before it (:class:`Steps`). Every logprob goes through
:mod:`detsample.ops.logprobs`; the kept sets are step 8's (:class:`KeptCDF`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from detsample import rules
from detsample.ops import logprobs as lp_ops
from detsample.sampling.backend import TORCH
from detsample.sampling.keptset import KeptCDF
from detsample.sampling.prepare import Prepared
from detsample.sampling.rowplan import RowPlan, Rows

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Steps:
    """Steps 1-8 of one call: the batch (a SamplingBatch), steps 1-5 (``prep``), the
    plan, the greedy tokens (or None), z (or None), the kept set and the uniforms (or
    None), and the "raw" rows' log-normalisers when computed early (:func:`raw_normalisers`;
    else None)."""

    batch: object
    prep: Prepared
    plan: RowPlan
    greedy_tok: torch.Tensor | None
    z: torch.Tensor | None
    cdf: KeptCDF | None
    u: torch.Tensor | None
    raw_norm: tuple[torch.Tensor, torch.Tensor] | None = None


def raw_normalisers(prep: Prepared, plan: RowPlan) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (B,) maxima and log-normalisers of the "raw" logits (the sanitised model
    logits) when some row's logprob is "raw" and the torch ops run: one fused pass
    (:func:`detsample.arith.normalisers`), done before step 8 -- on a CPU that pass runs
    on numba threads, and step 8's torch operations leave OpenMP workers spinning for
    milliseconds, which it would compete with after them. The same bits as
    ``log_softmax(raw, at=...)``. None otherwise."""
    if "raw" not in plan.modes or prep.backend is not TORCH:
        return None
    m = None if prep.raw_max is None else prep.raw_max.squeeze(1)
    return lp_ops.row_normalisers(prep.raw, m)


def processed_fixed(
    cdf: KeptCDF, batch, rows: Rows, z: torch.Tensor, ids: torch.Tensor, greedy_tok: torch.Tensor, *, exp
) -> torch.Tensor:
    """The "processed_fixed" logprob of scaled logits ``z`` with token ids ``ids`` of
    ``rows``: either (n,) picked tokens, or (n, V) full rows with ``ids`` (1, V).
    Kept entries get the renormalised logprob of the draw, others -inf; a greedy row
    is one-hot on its greedy token."""
    col = _column if z.dim() == 2 else _as_is
    keep = kept_mask(cdf, batch, rows, z, col, exp)
    lp = lp_ops.log_softmax(z, kept_mass=col(rows.take(cdf.total).clamp(min=1)), frac=rules.frac_bits(batch.vocab_size))
    return one_hot_greedy(lp.masked_fill(~keep, NEG_INF), batch, rows, ids, greedy_tok, col)


def _column(t: torch.Tensor) -> torch.Tensor:
    """A (n,) row quantity as a (n, 1) column against (n, V) rows."""
    return t.unsqueeze(1)


def _as_is(t: torch.Tensor) -> torch.Tensor:
    """A (n,) row quantity against (n,) picked tokens: unchanged."""
    return t


def kept_mask(cdf: KeptCDF, batch, rows: Rows, z: torch.Tensor, col, exp) -> torch.Tensor:
    """bool, z's shape: the kept set of step 8 (the threshold, then the element-wise
    filters, tested on the backend's own ``exp``, the one its draw used)."""
    e = exp(z)
    by_value = rules.element_keeps(e if z.dim() == 2 else e.unsqueeze(1), rows.take(batch.element_filters))
    return (z >= col(rows.take(cdf.tau))) & (by_value if z.dim() == 2 else by_value.squeeze(1))


def one_hot_greedy(
    lp: torch.Tensor, batch, rows: Rows, ids: torch.Tensor, greedy_tok: torch.Tensor, col
) -> torch.Tensor:
    """``lp`` with greedy rows replaced by their one-hot distribution (0 on the greedy
    token, -inf elsewhere)."""
    onehot = torch.where(ids == col(rows.take(greedy_tok)), torch.zeros_like(lp), torch.full_like(lp, NEG_INF))
    return torch.where(col(rows.take(batch.greedy)), onehot, lp)


def processed_rows(st: Steps, rows: Rows) -> torch.Tensor:
    """(n, V) vLLM's "processed" logprobs of ``rows``: ``log_softmax`` of step 5's
    logits divided by the temperature, -inf outside step 8's kept set
    (:func:`~detsample.ops.logprobs.processed_log_softmax`); greedy rows one-hot."""
    col = _column
    prep, batch = st.prep, st.batch
    keep = kept_mask(st.cdf, batch, rows, rows.take(st.z), col, prep.backend.exp)
    lp = lp_ops.processed_log_softmax(rows.take(prep.x), rows.take(st.plan.temperatures), keep)
    full = torch.arange(batch.vocab_size, device=st.z.device).unsqueeze(0)
    return one_hot_greedy(lp, batch, rows, full, st.greedy_tok, col)


def token_logprobs(st: Steps, tokens: torch.Tensor, some_none: bool) -> torch.Tensor:
    """(B,) float32 logprob of ``tokens`` (-1 = none: -inf) in each row's mode;
    ``some_none``: whether any token may be -1."""
    prep, plan = st.prep, st.plan
    out = torch.full((plan.size,), NEG_INF, dtype=torch.float32, device=tokens.device) if len(plan.modes) > 1 else None
    safe = tokens.clamp(min=0) if some_none else tokens
    for mode, rows in plan.modes.items():
        picked = rows.take(safe)
        if mode == "processed":
            vals = lp_ops.gather_rows(processed_rows(st, rows), picked)
        elif mode == "processed_fixed":
            ztok = lp_ops.gather_rows(rows.take(st.z), picked)
            vals = processed_fixed(st.cdf, st.batch, rows, ztok, picked, st.greedy_tok, exp=prep.backend.exp)
        elif mode == "raw" and st.raw_norm is not None:
            m, G = st.raw_norm
            vals = lp_ops.log_softmax(rows.take(prep.raw), at=picked, norm=(rows.take(m), rows.take(G)))
        else:
            sub = rows.take(prep.raw if mode == "raw" else st.z)
            vals = prep.backend.log_softmax_at(sub, picked)
        if out is None:
            out = vals
        else:
            out[rows.index] = vals
    return out.masked_fill(tokens < 0, NEG_INF) if some_none else out


def top_logprobs(st: Steps) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The top-n logprobs of every row asking for them, in its mode (None: no row)."""
    prep, plan, batch = st.prep, st.plan, st.batch
    n = plan.max_top
    if n == 0:
        return None
    B, dev = plan.size, batch.device
    vals = torch.full((B, n), NEG_INF, dtype=torch.float32, device=dev)
    ids = torch.full((B, n), -1, dtype=torch.int64, device=dev)
    for mode, rows in plan.top.items():
        if mode == "processed":
            lp = processed_rows(st, rows)
        elif mode == "processed_fixed":
            full = torch.arange(batch.vocab_size, device=dev).unsqueeze(0)
            lp = processed_fixed(st.cdf, batch, rows, rows.take(st.z), full, st.greedy_tok, exp=prep.backend.exp)
        else:
            lp = prep.backend.log_softmax(rows.take(prep.raw if mode == "raw" else st.z))
        v, i = lp_ops.topn(lp, n)
        vals[rows.index] = v
        ids[rows.index] = i
    beyond = torch.arange(n, device=dev).unsqueeze(0) >= plan.want_top.unsqueeze(1)
    return vals.masked_fill(beyond, NEG_INF), ids.masked_fill(beyond, -1)
