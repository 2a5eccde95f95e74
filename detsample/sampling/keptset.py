"""Pipeline step 8, "thresholds and kept mass": the kept set of every sampling row and the
CDF table its draw reads, by one function (:func:`kept_cdf`) with two strategies.

* **bounded**: the row's kept set lies among candidates, and ONE function of them,
  :func:`~detsample.ops.filters.kept_prefix`, finds it: a ``topk`` grown until the kept
  prefix provably ends inside it (small top-k rows start at ``k_max + 1`` candidates,
  the extra one proving that no tie group spills past them; top-p rows, with or without
  a top-k or an element-wise filter, at ``NUCLEUS_CANDIDATES``, against their exact mass
  over the full row), or, given as candidates, a plain grammar row's allowed columns
  (:mod:`detsample.ops.colcdf`). Its table is compact: the kept ids in token-id order
  and their running mass.
* **full**: the threshold over the whole row -- the sort's (``filter_impl="sort"``), its
  radix select (:mod:`detsample.ops.radix`), a top-k's k-th value, or none (plain rows)
  -- then the blocked CDF of the kept masses over the vocabulary.

A row the bounded strategy cannot decide (a tie group spilling past its candidates, a
nucleus outgrowing them) *spills* to the full strategy: that is the only hand-off. Every
strategy keeps, for every row, the full stable sort's kept set and exact fixed-point mass
bit for bit (tests/test_sampler.py holds each to ``filter_impl="sort"``); the result is
one :class:`KeptCDF`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from detsample import rules
from detsample.ops import colcdf
from detsample.ops import draw as draw_ops
from detsample.ops import filters as filter_ops
from detsample.ops import radix
from detsample.sampling.rowplan import CANDIDATE_RATIO, RowPlan, Rows

#: first candidate count of a top-p row, and the growth factor while undecided
NUCLEUS_CANDIDATES = 64
NUCLEUS_GROWTH = 8
#: a plain grammar row is drawn over its allowed columns when they are at most this
#: fraction of the vocabulary (beyond it the gather costs about what the full pass does)
COLUMN_DRAW_MAX = 0.25
#: rows that need the full sort's threshold get it by radix select (ops.radix) from this
#: vocabulary size on (CPU, filter_impl "auto"); below it the sort is as fast
SELECT_MIN_V = 4096
#: ... and a top-p row stops growing its candidates once its nucleus is known to hold
#: more than V / SELECT_RATIO tokens
SELECT_RATIO = 64
NEG_INF = float("-inf")


@dataclass(frozen=True)
class Table:
    """The CDF table of n rows of the batch: ``index`` (n,) int64 their rows (``every``:
    all rows of the batch, in order); ``csum`` the running kept mass, ``csum[:, -1]`` the
    exact kept mass ``Q``. Compact (bounded strategy): ``ids`` (n, K) int64 the kept ids
    ascending, then ``rules.PAD_ID``, and ``csum`` (n, K) in that order. Blocked (full
    strategy): ``ids`` None, ``q`` (n, V) int64 the kept masses, ``csum`` (n, nb) their
    running sums by blocks of ``draw.BLOCK``. ``tau``: (n,) float32 kept thresholds, or
    None (the full strategy's are in :class:`KeptCDF`)."""

    index: torch.Tensor
    every: bool
    csum: torch.Tensor
    ids: torch.Tensor | None = None
    q: torch.Tensor | None = None
    tau: torch.Tensor | None = None

    def draw(self, u: torch.Tensor) -> torch.Tensor:
        """(n,) int64 tokens for the rows' float64 uniforms ``u`` (n,)."""
        if self.ids is not None:
            return draw_ops.draw_by_cdf(self.ids, self.csum, u)
        return draw_ops.draw_by_blocks(self.q, self.csum, u)

    def rows(self, sel: torch.Tensor) -> "Table":
        """The rows at positions ``sel`` (n',) of this table."""
        return Table(self.index[sel], False, self.csum[sel], self.ids[sel],
                     None, None if self.tau is None else self.tau[sel])


@dataclass(frozen=True)
class KeptCDF:
    """Step 8's result for a batch of B rows: ``tau`` (B,) float32, kept = ``(z >= tau) &
    rules.element_keeps(exp(z), element_filters)`` (``-inf`` on rows without a value
    threshold and on non-sampling rows); ``total`` (B,) int64 the exact kept mass ``Q`` (0
    on non-sampling rows); ``tables`` the draw's tables of the sampling rows; ``drawn``
    (B,) int64 tokens already drawn with the cut (the Triton kernel fusing steps 8 and 9),
    else None."""

    tau: torch.Tensor
    total: torch.Tensor
    tables: tuple[Table, ...] = ()
    drawn: torch.Tensor | None = None

    @staticmethod
    def none(B: int, device: torch.device) -> "KeptCDF":
        """No sampling row: nothing is cut, no mass (processed logprobs are one-hot)."""
        return KeptCDF(torch.full((B,), NEG_INF, dtype=torch.float32, device=device),
                       torch.zeros((B,), dtype=torch.int64, device=device))

    def draw(self, u: torch.Tensor) -> torch.Tensor:
        """(B,) int64 tokens of the rows in the tables, -1 elsewhere; u: (B,) float64."""
        if self.drawn is not None:
            return self.drawn
        if len(self.tables) == 1 and self.tables[0].every:
            return self.tables[0].draw(u)
        tokens = torch.full(u.shape, -1, dtype=torch.int64, device=u.device)
        for t in self.tables:
            tokens[t.index] = t.draw(u[t.index])
        return tokens


@dataclass(frozen=True)
class CutInputs:
    """What step 8 reads besides the scaled logits and the plan (B rows, V tokens).

    x: (B, V) float32 logits after steps 1-5; shift: (B, 1) float32 the maxima step 7
    subtracts; filters: the batch's (top_ks, top_ps, element_filters) row tensors;
    columns / column_values: step 4's allowed columns of grammar rows (see the Sampler's
    ``Prepared``), or None; scaled: a callable giving step 7's z over the vocabulary
    (called only when a row needs it); scratch: ``(name, like, dtype) -> tensor``, a
    reused buffer; deterministic / filter_impl: the Sampler's settings."""

    x: torch.Tensor
    shift: torch.Tensor
    filters: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    columns: dict | None
    column_values: dict | None
    scaled: Callable[[], torch.Tensor]
    scratch: Callable
    deterministic: bool = True
    filter_impl: str = "auto"

    @property
    def select(self) -> bool:
        """Whether the full strategy's thresholds come from the radix select."""
        return (self.filter_impl == "auto" and self.x.shape[1] >= SELECT_MIN_V
                and self.x.device.type == "cpu")


def column_rows(plan: RowPlan, cols: dict | None, x: torch.Tensor) -> tuple[Rows, Rows] | None:
    """The plain sampling rows of grammar rows whose logits ``x`` (B, V) are ``-inf``
    outside at most ``COLUMN_DRAW_MAX`` of the vocabulary (step 4's ``cols``), and the
    other plain rows; None when there is none."""
    plain = plan.route.plain
    if not cols or not plain:
        return None
    most = COLUMN_DRAW_MAX * x.shape[1]
    rows, rest = [], []
    for r in plain.rows:
        c = cols.get(r)
        (rows if c is not None and c.size <= most else rest).append(r)
    if not rows:
        return None
    return Rows.of(rows, plan.size, x.device), Rows.of(rest, plan.size, x.device)


def needs_full_z(plan: RowPlan, by_columns: tuple[Rows, Rows] | None) -> bool:
    """Whether step 8 needs z over the vocabulary from the start: every strategy but the
    small top-k candidates (scaled from the logits) and the allowed-columns rows."""
    rt = plan.route
    plain = rt.plain if by_columns is None else by_columns[1]
    wide = rt.filters is not None and rt.filters.wide is not None
    return bool(wide or rt.top_k_only or rt.sort or plain)


def kept_cdf(z: torch.Tensor | None, plan: RowPlan, inp: CutInputs,
             by_columns: tuple[Rows, Rows] | None = None) -> KeptCDF:
    """Step 8 of the sampling rows of ``plan``: the bounded strategy first, then the full
    strategy for every row it leaves (its own rows and the spilled ones).

    z: (B, V) float32 scaled logits, or None when only small top-k rows and allowed-
    columns rows sample (then it is computed only if a row spills); ``by_columns``:
    :func:`column_rows`. Returns the batch's :class:`KeptCDF`."""
    B, V = inp.x.shape
    frac = rules.frac_bits(V)
    tables, spilled = _bounded(z, plan, inp, by_columns, frac)
    if spilled and z is None:
        z = inp.scaled()
    if len(tables) == 1 and tables[0].every and tables[0].tau is not None:
        t = tables[0]  # one table for every row, in order: its thresholds and masses
        return KeptCDF(t.tau, t.csum[:, -1], (t,))
    tau = torch.full((B,), NEG_INF, dtype=torch.float32, device=inp.x.device)
    total = torch.zeros((B,), dtype=torch.int64, device=inp.x.device)
    for t in tables:
        _scatter(total, t, t.csum[:, -1])
        if t.tau is not None:
            _scatter(tau, t, t.tau)
    plain = plan.route.plain if by_columns is None else by_columns[1]
    full = _full(z, plan, inp, plain, spilled, tau=tau, frac=frac)
    if full is not None:
        if full.every:
            total = full.csum[:, -1]
        else:
            total[full.index] = full.csum[:, -1]
        tables.append(full)
    return KeptCDF(tau, total, tuple(tables))


def _scatter(dst: torch.Tensor, t: Table, values: torch.Tensor) -> None:
    if t.every:
        dst.copy_(values)
    else:
        dst[t.index] = values


# -- the bounded strategy ------------------------------------------------------------

def _bounded(z: torch.Tensor | None, plan: RowPlan, inp: CutInputs,
             by_columns: tuple[Rows, Rows] | None, frac: int
             ) -> tuple[list[Table], list[torch.Tensor]]:
    """The compact tables of the rows decided on candidates, and the row indices that
    spill to the full strategy."""
    tables: list[Table] = []
    spilled: list[torch.Tensor] = []
    if plan.route.bounded:
        got, spill = _grown(z, plan, inp, frac)
        tables.extend(got)
        if spill is not None:
            spilled.append(spill)
    if by_columns is not None:
        tables.append(_columns(by_columns[0], plan, inp, frac))
    return tables, spilled


@dataclass(frozen=True)
class _Pending:
    """The bounded rows still undecided (n of them): their batch rows ``idx``
    (``every``: all rows of the batch, in order), the (n, V) tensor their candidates come
    from (``z``, or the logits ``x`` with ``scale`` = (shift, temperatures), n rows each:
    only the candidates are scaled) and their :class:`~detsample.ops.filters.CandidateCut`."""

    idx: torch.Tensor
    every: bool
    src: torch.Tensor
    scale: tuple[torch.Tensor, torch.Tensor] | None
    cut: filter_ops.CandidateCut

    def topk(self, K: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The K largest scaled logits of each row, descending, and their ids."""
        if self.scale is not None:
            return filter_ops.logit_topk(self.src, *self.scale, K)
        return torch.topk(self.src, K, dim=-1, largest=True, sorted=True)

    def rows(self, sel: torch.Tensor) -> "_Pending":
        return _Pending(self.idx[sel], False, self.src[sel],
                        None if self.scale is None else (self.scale[0][sel], self.scale[1][sel]),
                        self.cut.rows(sel))


def _pending(z: torch.Tensor | None, plan: RowPlan, inp: CutInputs, frac: int) -> _Pending:
    """The bounded rows' first state: the rows without a small top-k get their top-k
    threshold and survivors' exact mass over the full row (so ``z`` is given when there
    are some: :func:`needs_full_z`)."""
    rows, bf = plan.route.bounded, plan.route.filters
    thr = total = None
    if bf.wide is not None:
        every = bf.k_index is None  # every bounded row is wide
        zw = rows.take(z) if every else z.index_select(0, rows.index[bf.wide])
        top_ks = rows.filters[0] if every else rows.filters[0][bf.wide]
        tw = filter_ops.topk_threshold(zw, top_ks) if bf.wide_k else None
        mw = filter_ops.survivor_mass(zw, tw, frac, out=inp.scratch("w", zw),
                                      q_out=inp.scratch("q", zw, torch.int64))
        if every:
            thr, total = (None if tw is None else tw.unsqueeze(1)), mw.unsqueeze(1)
        else:
            n = len(rows)
            thr = torch.full((n, 1), NEG_INF, dtype=torch.float32, device=zw.device)
            total = torch.zeros((n, 1), dtype=torch.int64, device=zw.device)
            if tw is not None:
                thr[bf.wide] = tw.unsqueeze(1)
            total[bf.wide] = mw.unsqueeze(1)
    cut = filter_ops.CandidateCut(bf.k_index, bf.small, thr, total, bf.top_p, bf.element)
    if z is None:  # small top-k rows only: candidates from the logits
        return _Pending(rows.index, rows.every, rows.take(inp.x), (
            rows.take(inp.shift), rows.take(plan.temperatures)), cut)
    return _Pending(rows.index, rows.every, rows.take(z), None, cut)


def _decided(vals: torch.Tensor, n: torch.Tensor, thr: torch.Tensor | None,
             cut: filter_ops.CandidateCut, fast: bool) -> torch.Tensor:
    """(n,) bool: the rows whose kept prefix provably ends inside their K candidates.
    A row with a small top-k: its survivors are all candidates (the last candidate is
    below its top-k threshold; the fast mode skips this tie-spill check); another: its
    prefix ends before the last candidate (its mass is the full row's)."""
    if cut.k_index is None:
        return n < vals.shape[-1]
    fits = torch.ones_like(n, dtype=torch.bool) if fast else vals[:, -1] < thr.squeeze(1)
    if cut.small is None:
        return fits
    return torch.where(cut.small.squeeze(1), fits, n < vals.shape[-1])


def _growth(vals: torch.Tensor, p: _Pending, frac: int) -> int:
    """How many more candidates the undecided rows at least need: for a top-p row
    without top-k and element-wise filters, its mass still short of the limit over the
    largest mass a non-candidate can have (0 for the others; a bound, never a result)."""
    c = p.cut
    if c.total is None or c.top_p is None:
        return 0
    plain = (c.top_p.squeeze(1) < 1.0) & (c.total.squeeze(1) > 0)
    if c.thr is not None:
        plain &= torch.isneginf(c.thr.squeeze(1))
    if c.element is not None:
        plain &= ~rules.element_active(c.element)
    if c.small is not None:
        plain &= ~c.small.squeeze(1)
    if not bool(plain.any()):
        return 0
    need = filter_ops.mass_needed_bound(vals, c.total.squeeze(1), c.top_p.squeeze(1), frac)
    return int(torch.where(plain, need, torch.zeros_like(need)).max())


def _grown(z: torch.Tensor | None, plan: RowPlan, inp: CutInputs, frac: int
           ) -> tuple[list[Table], torch.Tensor | None]:
    """The bounded strategy: a ``topk`` of K candidates (first ``k_max + 1`` for small
    top-k rows, at least ``NUCLEUS_CANDIDATES`` with top-p rows), the kept set by
    :func:`~detsample.ops.filters.kept_prefix`, and for the undecided rows a ``topk``
    ``NUCLEUS_GROWTH`` times larger, until every row is decided; the rows that would need
    more than ``V / CANDIDATE_RATIO`` candidates spill (with the radix select, as soon as
    a nucleus is known to hold more than ``V / SELECT_RATIO`` tokens: a larger ``topk``
    would cost more than the select)."""
    V, bf = inp.x.shape[1], plan.route.filters
    p = _pending(z, plan, inp, frac)
    K = min(max(plan.route.k_max + 1 if bf.k_index is not None else 0,
                NUCLEUS_CANDIDATES if bf.wide is not None else 0), V)
    cap, tables = max(V // CANDIDATE_RATIO, 1), []
    while True:
        vals, ids = p.topk(K)
        n, kept, q, thr = filter_ops.kept_prefix(vals, p.cut, frac)
        decided = _decided(vals, n, thr, p.cut, not inp.deterministic)
        if K == V or bool(decided.all()):
            return tables + [_table(p.idx, p.every, vals, ids, (n, kept, q))], None
        dec, und = decided.nonzero().flatten(), (~decided).nonzero().flatten()
        if dec.numel():
            tables.append(_table(p.idx[dec], False, vals[dec], ids[dec],
                                 (n[dec], kept[dec], q[dec])))
        p = p.rows(und)
        bound = _growth(vals[und], p, frac)
        K = min(max(K * NUCLEUS_GROWTH, bound + K + 1), V)
        if K > cap or (inp.select and bound > V // SELECT_RATIO):
            return tables, p.idx


def _table(idx: torch.Tensor, every: bool, vals: torch.Tensor, ids: torch.Tensor,
           cut: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> Table:
    """The compact table of rows whose kept set is the first ``n`` of their descending
    candidates; ``cut`` = (n, kept, q) of :func:`~detsample.ops.filters.kept_prefix`."""
    n, kept, q = cut
    sorted_ids, csum = draw_ops.kept_cdf(ids, q, kept)
    return Table(idx, every, csum, sorted_ids,
                 tau=vals.gather(1, (n - 1).unsqueeze(1)).squeeze(1))


def _columns(rows: Rows, plan: RowPlan, inp: CutInputs, frac: int) -> Table:
    """Plain grammar rows drawn over their allowed columns: their compact table (their
    threshold stays ``-inf``, as on the full strategy)."""
    known = inp.column_values
    vals, ids = colcdf.gather_columns(inp.x, rows.rows, [inp.columns[r] for r in rows.rows],
                                      None if known is None else
                                      [known.get(r) for r in rows.rows])
    ids, csum = colcdf.column_cdf(vals, ids, rows.take(inp.shift),
                                  rows.take(plan.temperatures), rows.take(inp.filters[2]),
                                  frac, cut_element=None if plan.any_element else False)
    return Table(rows.index, rows.every, csum, ids)


# -- the full strategy ---------------------------------------------------------------

def _full(z: torch.Tensor, plan: RowPlan, inp: CutInputs, plain: Rows,
          spilled: list[torch.Tensor], *, tau: torch.Tensor, frac: int) -> Table | None:
    """The blocked table of every row drawn over the vocabulary: the sort's rows and the
    spilled ones (the sort's threshold, or its radix select), the large top-k rows (the
    k-th value) and the plain rows (no threshold); their thresholds land in ``tau``."""
    rt = plan.route
    top_ks, top_ps, element = inp.filters
    sort_idx = ([rt.sort.index] if rt.sort else []) + spilled
    full_idx = list(sort_idx)
    if sort_idx:
        si = torch.cat(sort_idx) if len(sort_idx) > 1 else sort_idx[0]
        by = radix.thresholds_by_select if inp.select else filter_ops.thresholds_by_sort
        tau[si] = by(z.index_select(0, si), top_ks[si], top_ps[si], element[si], frac)
    if rt.top_k_only:
        ti = rt.top_k_only.index
        tau[ti] = filter_ops.topk_threshold(rt.top_k_only.take(z), top_ks[ti])
        full_idx.append(ti)
    if plain:
        full_idx.append(plain.index)
    if not full_idx:
        return None
    fi = torch.cat(full_idx) if len(full_idx) > 1 else full_idx[0]
    every = len(full_idx) == 1 and fi.numel() == plan.size and (
        plain.every or rt.top_k_only.every or rt.sort.every)
    zf, tf, ef = (z, tau, element) if every else (z.index_select(0, fi), tau[fi], element[fi])
    q, bsum = draw_ops.block_cdf(zf, tf, ef, frac, out=inp.scratch("w", zf),
                                 q_out=inp.scratch("q", zf, torch.int64),
                                 cut_tau=len(full_idx) > bool(plain),
                                 cut_element=None if plan.any_element else False)
    return Table(fi, every, bsum, q=q)
