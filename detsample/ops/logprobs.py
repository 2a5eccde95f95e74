"""Pipeline step 10: logprobs, always through ``log_softmax`` (never ``log(softmax)``).

``torch.log_softmax`` gives a row the same bits at every batch size and thread count on
the platforms we test (tests/ops/test_logprobs.py keeps that measured), so the sampling
path and the rescoring path (``Sampler.compute_logprobs``) agree bitwise.
The "processed" mode is the log of the final filtered, renormalised distribution:
``z_i - log(Q * 2**-F)`` with the exact fixed-point kept mass ``Q`` of the draw, i.e. a
log_softmax over the kept set whose normaliser is an exact (order-free) sum.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def log_softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x: (batch, vocab) float32 -> (batch, vocab) float32 log_softmax (row-invariant)."""
    return torch.log_softmax(x, dim=-1)


def gather_rows(values: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """values: (batch, vocab); token_ids: (batch,) int64 -> (batch,) picked values."""
    return values.gather(1, token_ids.unsqueeze(1)).squeeze(1)


def processed_logprob(z_tok: torch.Tensor, total_mass: torch.Tensor, frac: int) -> torch.Tensor:
    """``float32(float64(z_tok) - log(float64(Q) * 2**-frac))``.

    z_tok: (rows,) or (rows, n) float32 scaled logits (row max 0); total_mass: int64
    kept mass ``Q`` broadcastable to ``z_tok``. Bitwise identical whichever draw path
    produced ``Q`` (it is exact). The power-of-two scaling is exact, so a token that
    carries all the kept mass (``Q == 2**frac``, ``z == 0``) gets exactly 0 (``log(Q) -
    frac * ln 2`` would leave a ~1e-14 residue).
    """
    norm = torch.log(total_mass.to(torch.float64) * (2.0 ** -frac))
    return (z_tok.to(torch.float64) - norm).to(torch.float32)


def topn(values: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``n`` largest entries per row, ordered by (value desc, token id asc).

    values: (batch, vocab) float32 without NaN. Returns ((batch, n) float32,
    (batch, n) int64). Deterministic on ties: a bounded ``topk`` decides the set when
    the n-th value is not tied beyond n entries; other rows use a full stable sort.
    Both give the same result (tested), so the choice never changes a row's output.
    """
    B = values.shape[0]
    if n == 0 or B == 0:
        return (values.new_empty((B, 0)), torch.empty((B, 0), dtype=torch.int64,
                                                      device=values.device))
    V = values.shape[-1]
    vals, ids = torch.topk(values, min(n + 1, V), dim=-1, largest=True, sorted=True)
    # the set is exact unless the (n+1)-th largest value ties the n-th
    exact = vals[:, n] < vals[:, n - 1] if V > n else torch.ones(B, dtype=torch.bool, device=values.device)
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
