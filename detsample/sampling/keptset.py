"""Pipeline step 8, "thresholds and kept mass": the kept set of every sampling row and the
CDF table its draw reads, by one function (:func:`kept_cdf`) with two strategies.

* **bounded**: the row's kept set lies among candidates, and ONE function of them,
  :func:`~detsample.ops.filters.kept_prefix`, finds it. The candidates are an upper set
  of the row's values: for a small top-k row a ``topk`` of ``k_max + 1`` (grown while the
  extra one cannot prove that no tie group spills past them); for a top-p row (with or
  without a top-k or an element-wise filter) the elements above a value ``L`` below its
  threshold, found from its column-group maxima (:mod:`detsample.ops.nucleus`), checked
  by their own mass against the exact mass of the full row; for a plain grammar row its
  allowed columns (:mod:`detsample.ops.colcdf`). Its table is compact: the kept ids in
  token-id order and their running mass.
* **full**: the threshold over the whole row -- the sort's (``filter_impl="sort"``), its
  radix select (:mod:`detsample.ops.radix`), a top-k's k-th value, or none (plain rows)
  -- then the blocked CDF of the kept masses over the vocabulary.

A row the bounded strategy cannot decide (a tie group spilling past its candidates, a
nucleus whose group maxima never reach the limit: most of the row) *spills* to the full
strategy: that is the only hand-off. Every strategy keeps, for every row, the full stable
sort's kept set and exact fixed-point mass bit for bit (tests/test_sampler.py holds each
to ``filter_impl="sort"``); the result is one :class:`KeptCDF`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from detsample import rules
from detsample.ops import colcdf, nucleus, radix, rowpass, select
from detsample.ops import draw as draw_ops
from detsample.ops import filters as filter_ops
from detsample.sampling.rowplan import CANDIDATE_RATIO, RowPlan, Rows

#: how much a small top-k row's ``topk`` grows while a tie group may spill past it
TOPK_GROWTH = 8
#: a plain grammar row is drawn over its allowed columns when they are at most this
#: fraction of the vocabulary (beyond it the gather costs about what the full pass does)
COLUMN_DRAW_MAX = 0.25
#: a top-p row's first candidates below ``BY_VALUE_MIN`` (a ``topk``: a peaked row's
#: nucleus ends inside it; the other rows take their candidates by value)
NUCLEUS_CANDIDATES = 64
#: top-p rows (rows x V elements) from which the candidates are taken by value at once
#: (:mod:`detsample.ops.nucleus`, a few passes over the rows); below it the exact mass
#: and a ``topk`` of ``NUCLEUS_CANDIDATES`` come first (fewer, smaller operations for a
#: peaked row; docs/performance.md)
BY_VALUE_MIN = 1 << 21
#: rows that need the full sort's threshold get it by radix select (ops.radix) from this
#: vocabulary size on (CPU, filter_impl "auto"); below it the sort is as fast
SELECT_MIN_V = 4096
NEG_INF = float("-inf")


@dataclass(frozen=True)
class Table:
    """The CDF table of n rows of the batch: ``index`` (n,) int64 their rows (``every``:
    all rows of the batch, in order); ``csum`` the running kept mass, ``csum[:, -1]`` the
    exact kept mass ``Q``. Compact (bounded strategy): ``ids`` (n, K) int64 the kept ids
    ascending, then ``rules.PAD_ID``, and ``csum`` (n, K) in that order. Blocked (full
    strategy): ``ids`` None, ``q`` (n, V) int64 the kept masses (or, not materialised,
    their ``rowpass.LazyMasses``), ``csum`` (n, nb) their running sums by blocks of
    ``draw.BLOCK``. ``tau``: (n,) float32 kept thresholds, or
    None (the full strategy's are in :class:`KeptCDF`)."""

    index: torch.Tensor
    every: bool
    csum: torch.Tensor
    ids: torch.Tensor | None = None
    q: torch.Tensor | rowpass.LazyMasses | None = None
    tau: torch.Tensor | None = None

    def draw(self, u: torch.Tensor) -> torch.Tensor:
        """(n,) int64 tokens for the rows' float64 uniforms ``u`` (n,)."""
        if self.ids is not None:
            return draw_ops.draw_by_cdf(self.ids, self.csum, u)
        return draw_ops.draw_by_blocks(self.q, self.csum, u)

    def rows(self, sel: torch.Tensor) -> Table:
        """The rows at positions ``sel`` (n',) of this table."""
        return Table(
            self.index[sel], False, self.csum[sel], self.ids[sel], None, None if self.tau is None else self.tau[sel]
        )


@dataclass(frozen=True)
class KeptCDF:
    """Step 8's result for a batch of B rows: ``tau`` (B,) float32, kept = ``(z >= tau) &
    rules.element_keeps(exp(z), element_filters)`` (``-inf`` on rows without a value
    threshold and on non-sampling rows); ``total`` (B,) int64 the exact kept mass ``Q``
    (0 on non-sampling rows); ``tables`` the draw's tables of the sampling rows;
    ``drawn`` (B,) int64 tokens already drawn with the cut (the Triton kernel fusing
    steps 8 and 9), else None."""

    tau: torch.Tensor
    total: torch.Tensor
    tables: tuple[Table, ...] = ()
    drawn: torch.Tensor | None = None

    @staticmethod
    def none(B: int, device: torch.device) -> KeptCDF:
        """No sampling row: nothing is cut, no mass (processed logprobs are one-hot)."""
        return KeptCDF(
            torch.full((B,), NEG_INF, dtype=torch.float32, device=device),
            torch.zeros((B,), dtype=torch.int64, device=device),
        )

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
    reused buffer; deterministic / filter_impl: the Sampler's settings; prepass: the
    call's fused first pass (:func:`~detsample.ops.rowpass.first_pass`) when it ran, whose
    totals and maxima hold for the rows of :func:`prepass_rows`."""

    x: torch.Tensor
    shift: torch.Tensor
    filters: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    columns: dict | None
    column_values: dict | None
    scaled: Callable[[], torch.Tensor]
    scratch: Callable
    deterministic: bool = True
    filter_impl: str = "auto"
    prepass: rowpass.FirstPass | None = None  # the rows' exact masses and group maxima
    #                                           when the call's first pass computed them

    @property
    def select(self) -> bool:
        """Whether the full strategy's thresholds come from the radix select."""
        return self.filter_impl == "auto" and self.x.shape[1] >= SELECT_MIN_V and self.x.device.type == "cpu"


def prepass_rows(plan: RowPlan) -> torch.Tensor | None:
    """The batch rows whose exact mass and group maxima step 8 reads over the full row:
    the top-p rows without a small top-k when none of them has a top-k (``None``: no
    such rows)."""
    bf = plan.route.filters
    if bf is None or bf.wide is None or bf.wide_k:
        return None
    return _part(plan, wide=True)[1]


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


def kept_cdf(
    z: torch.Tensor | None, plan: RowPlan, inp: CutInputs, by_columns: tuple[Rows, Rows] | None = None
) -> KeptCDF:
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


def _bounded(
    z: torch.Tensor | None, plan: RowPlan, inp: CutInputs, by_columns: tuple[Rows, Rows] | None, frac: int
) -> tuple[list[Table], list[torch.Tensor]]:
    """The compact tables of the rows decided on candidates, and the row indices that
    spill to the full strategy: small top-k rows on a grown ``topk`` (:func:`_grown`),
    top-p rows on the elements above a bound of their threshold (:func:`_nucleus`)."""
    tables: list[Table] = []
    spilled: list[torch.Tensor] = []
    bf = plan.route.filters
    for some, part in (
        (bf is not None and bf.k_index is not None, _small_top_k),
        (bf is not None and bf.wide is not None, _nucleus),
    ):
        if some:
            got, spill = part(z, plan, inp, frac)
            tables.extend(got)
            if spill is not None:
                spilled.append(spill)
    if by_columns is not None:
        tables.append(_columns(by_columns[0], plan, inp, frac))
    return tables, spilled


@dataclass(frozen=True)
class _Pending:
    """The small top-k rows still undecided (n of them): their batch rows ``idx``
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
        return select.topk(self.src, K)

    def rows(self, sel: torch.Tensor) -> _Pending:
        return _Pending(
            self.idx[sel],
            False,
            self.src[sel],
            None if self.scale is None else (self.scale[0][sel], self.scale[1][sel]),
            self.cut.rows(sel),
        )


def _at(t: torch.Tensor | None, pos: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` at the positions ``pos`` of the bounded rows (all of them: None); None stays."""
    return t if t is None or pos is None else t[pos]


def _take(t: torch.Tensor, idx: torch.Tensor, every: bool) -> torch.Tensor:
    """The batch rows ``idx`` of ``t`` (``every``: all of them in order, no copy)."""
    return t if every else t.index_select(0, idx)


def _part(plan: RowPlan, wide: bool) -> tuple[torch.Tensor | None, torch.Tensor, bool]:
    """The bounded rows with a small top-k (``wide`` False) or without (True): their
    positions among the bounded rows (None: all of them), batch rows, and whether those
    are every row of the batch in order."""
    rows, bf = plan.route.bounded, plan.route.filters
    if (bf.wide is None) if wide else (bf.k_index is None):
        raise ValueError("no such bounded rows")  # pragma: no cover - callers check
    if bf.wide is None or bf.k_index is None:
        return None, rows.index, rows.every
    pos = bf.wide if wide else bf.small.squeeze(1).nonzero().flatten()
    return pos, rows.index[pos], False


def _pending(z: torch.Tensor | None, plan: RowPlan, inp: CutInputs) -> _Pending:
    """The small top-k rows' first state: candidates from ``z``, or, when it is not
    computed (only such rows need it), from the logits, scaled on the candidates."""
    bf = plan.route.filters
    pos, idx, every = _part(plan, wide=False)
    cut = filter_ops.CandidateCut(k_index=_at(bf.k_index, pos), top_p=_at(bf.top_p, pos), element=_at(bf.element, pos))
    if z is None:
        scale = (_take(inp.shift, idx, every), _take(plan.temperatures, idx, every))
        return _Pending(idx, every, _take(inp.x, idx, every), scale, cut)
    return _Pending(idx, every, _take(z, idx, every), None, cut)


def _small_top_k(
    z: torch.Tensor | None, plan: RowPlan, inp: CutInputs, frac: int
) -> tuple[list[Table], torch.Tensor | None]:
    """The small top-k rows: :func:`_grown` from a ``topk`` of ``k_max + 1``."""
    V = inp.x.shape[1]
    tables, rest = _grown(
        _pending(z, plan, inp), min(plan.route.k_max + 1, V), inp, frac, small=True, cap=max(V // CANDIDATE_RATIO, 1)
    )
    return tables, None if rest is None else rest.idx


def _grown(
    p: _Pending, K: int, inp: CutInputs, frac: int, *, small: bool, cap: int
) -> tuple[list[Table], _Pending | None]:
    """The rows of ``p`` on a ``topk`` of K candidates, the kept set by
    :func:`~detsample.ops.filters.kept_prefix`, and for the undecided rows a ``topk``
    ``TOPK_GROWTH`` times larger, until every row is decided; the rows that would need
    more than ``cap`` candidates are returned undecided. A small top-k row (``small``) is
    decided when its last candidate is below its k-th value (no top-k tie group spills
    past the candidates; the fast mode skips this check), a top-p row when its last
    candidate is not kept (the prefix ends inside the candidates, every value at or
    below the last one is cut: its exact mass is ``p.cut.total``)."""
    V, tables = inp.x.shape[1], []
    while True:
        vals, ids = p.topk(K)
        n, kept, q, thr = filter_ops.kept_prefix(vals, p.cut, frac)
        if not small:
            decided = ~kept[:, -1]
        elif inp.deterministic:
            decided = vals[:, -1] < thr.squeeze(1)
        else:
            decided = torch.ones_like(n, dtype=torch.bool)
        if K == V or bool(decided.all()):
            return tables + [_table(p.idx, p.every, vals, ids, (n, kept, q))], None
        dec, und = decided.nonzero().flatten(), (~decided).nonzero().flatten()
        if dec.numel():
            tables.append(_table(p.idx[dec], False, vals[dec], ids[dec], (n[dec], kept[dec], q[dec])))
        p = p.rows(und)
        K = min(K * TOPK_GROWTH, V)
        if cap < K:
            return tables, p


def _nucleus(z: torch.Tensor, plan: RowPlan, inp: CutInputs, frac: int) -> tuple[list[Table], torch.Tensor | None]:
    """The top-p rows without a small top-k. Rows of fewer than ``BY_VALUE_MIN``
    elements take their exact mass and a ``topk`` of ``NUCLEUS_CANDIDATES`` first (a
    peaked row's nucleus ends inside it, :func:`_grown`); the rest (all rows from that
    size on) take their candidates by value (:func:`_by_value`)."""
    pos, idx, every = _part(plan, wide=True)
    zw = _take(z, idx, every)
    first = zw.numel() < BY_VALUE_MIN
    # (the exact mass costs one fused pass where there is one: no bracket to settle)
    cut, lo, maxima = _nucleus_cut(
        zw, plan, pos, inp, frac, exact=first or rules.fused_masses(zw), maxima=not first, rows=(idx, every)
    )
    if not first:
        return _by_value(zw, idx, every, cut, lo, frac, maxima=maxima)
    K = min(NUCLEUS_CANDIDATES, zw.shape[1])
    tables, rest = _grown(_Pending(idx, every, zw, None, cut), K, inp, frac, small=False, cap=K)
    if rest is None:
        return tables, None
    got, spill = _by_value(rest.src, rest.idx, False, rest.cut, rest.cut.total.squeeze(1), frac)
    return tables + got, spill


@dataclass(frozen=True)
class _NucleusRows:
    """Top-p rows on the way through :func:`_by_value`, every field row-aligned: batch
    rows ``idx`` (``every``: all rows of the batch, in order), their scaled logits ``zw``
    (n, V), cut, lower mass bound ``lo`` (n,), top-p limit (n,), group maxima, value
    bound ``L`` (n,); then their candidates ``vals`` / ``ids`` (n, K) and
    :func:`~detsample.ops.filters.kept_prefix`'s ``n``, ``kept``, ``q``."""

    idx: torch.Tensor
    every: bool
    zw: torch.Tensor
    cut: filter_ops.CandidateCut
    lo: torch.Tensor
    limit: torch.Tensor
    maxima: torch.Tensor
    L: torch.Tensor
    vals: torch.Tensor | None = None
    ids: torch.Tensor | None = None
    n: torch.Tensor | None = None
    kept: torch.Tensor | None = None
    q: torch.Tensor | None = None

    def rows(self, sel: torch.Tensor) -> _NucleusRows:
        """The rows at positions ``sel`` (m,)."""

        def sub(v):
            if isinstance(v, filter_ops.CandidateCut):
                return v.rows(sel)
            return v if v is None else v[sel]

        return _NucleusRows(
            **{f.name: sub(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "every"}, every=False
        )

    def split(self, ok: torch.Tensor, spill: torch.Tensor | None) -> tuple[_NucleusRows, torch.Tensor | None]:
        """The rows where ``ok`` (n,) bool holds, and ``spill`` with the batch rows of
        the others appended."""
        if bool(ok.all()):
            return self, spill
        bad = self.idx[~ok]
        return self.rows(ok.nonzero().flatten()), bad if spill is None else torch.cat([spill, bad])


def _by_value(
    zw: torch.Tensor,
    idx: torch.Tensor,
    every: bool,
    cut: filter_ops.CandidateCut,
    lo: torch.Tensor,
    frac: int,
    *,
    maxima: torch.Tensor | None = None,
) -> tuple[list[Table], torch.Tensor | None]:
    """Top-p rows ``zw`` (n, V) (batch rows ``idx``) on the candidates ``z > L`` with
    ``L`` below the top-p threshold (:mod:`detsample.ops.nucleus`), the kept set by
    :func:`~detsample.ops.filters.kept_prefix` under both ends of the bracket
    [``lo``, ``cut.total``] of the full row's mass ``Z`` (a row whose kept set differs
    between them takes its exact ``Z``). A row is decided when its candidates' survivor
    mass fails the top-p test (so no element at or below ``L`` is kept); a row without
    such an ``L`` (its nucleus spans most of the row) or failing that check spills.
    ``maxima``: the rows' :func:`~detsample.ops.nucleus.group_maxima` when known."""
    limit = rules.top_p_limit(cut.top_p.squeeze(1), cut.total.squeeze(1))
    maxima = nucleus.group_maxima(zw) if maxima is None else maxima
    L, found = nucleus.lower_bound(maxima, cut.thr, limit, frac)
    r, spill = _NucleusRows(idx, every, zw, cut, lo, limit, maxima, L).split(found, None)
    if not r.idx.numel():
        return [], spill
    vals, ids = nucleus.above(r.zw, r.L, r.maxima)
    n, kept, q, _ = filter_ops.kept_prefix(vals, r.cut, frac)
    mass = (q if r.cut.thr is None else q * (vals >= r.cut.thr)).sum(-1)
    holds = ~rules.top_p_keeps(mass, r.limit)  # no element at or below L is kept
    r, spill = dataclasses.replace(r, vals=vals, ids=ids, n=n, kept=kept, q=q).split(holds, spill)
    n, kept = _settle(r.vals, r.zw, r.cut, r.lo, (r.n, r.kept), frac)
    return [_table(r.idx, r.every, r.vals, r.ids, (n, kept, r.q))], spill


def _nucleus_cut(
    zw: torch.Tensor,
    plan: RowPlan,
    pos: torch.Tensor | None,
    inp: CutInputs,
    frac: int,
    *,
    exact: bool,
    maxima: bool,
    rows: tuple[torch.Tensor, bool],
) -> tuple[filter_ops.CandidateCut, torch.Tensor, torch.Tensor | None]:
    """The top-p rows' cut with the upper end of their mass bracket as ``total``, the
    lower end (n,) int64 -- the exact survivor mass (both ends) for rows of a batch with
    a large top-k or when ``exact``, else :func:`~detsample.ops.nucleus.mass_bounds` --
    and, when ``maxima`` is asked and a fused CPU pass gave them with the exact mass,
    the rows' group maxima (else None). ``rows``: their batch rows and whether those
    are every row in order (to read the call's first pass, ``inp.prepass``)."""
    bounded, bf = plan.route.bounded, plan.route.filters
    thr, mx = None, None
    if bf.wide_k or exact:
        if bf.wide_k:
            thr = filter_ops.topk_threshold(zw, _at(bounded.filters[0], pos))
        both = _mass_and_maxima(zw, thr, frac, inp.prepass, rows) if maxima or inp.prepass is not None else None
        if both is not None:
            lo, mx = both
        else:
            lo = filter_ops.survivor_mass(
                zw, thr, frac, out=inp.scratch("w", zw), q_out=inp.scratch("q", zw, torch.int64)
            )
        hi = lo
        mx = mx if maxima else None
        thr = None if thr is None else thr.unsqueeze(1)
    else:
        lo, hi = nucleus.mass_bounds(zw, frac, out=inp.scratch("w", zw))
    cut = filter_ops.CandidateCut(
        thr=thr, total=hi.unsqueeze(1), top_p=_at(bf.top_p, pos), element=_at(bf.element, pos)
    )
    return cut, lo, mx


def _mass_and_maxima(
    zw: torch.Tensor,
    thr: torch.Tensor | None,
    frac: int,
    prepass: rowpass.FirstPass | None,
    rows: tuple[torch.Tensor, bool],
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rows' exact survivor mass and group maxima: from the call's first pass when it
    computed them (no top-k cut), else one fused pass over ``zw`` where there is one."""
    if prepass is not None and thr is None:
        idx, every = rows
        if every:
            return prepass.totals, prepass.maxima
        return prepass.totals[idx], prepass.maxima.index_select(0, idx)
    return rowpass.mass_and_maxima(zw, thr, frac, nucleus.GROUP)


def _settle(
    vals: torch.Tensor,
    zw: torch.Tensor,
    cut: filter_ops.CandidateCut,
    lo: torch.Tensor,
    got: tuple[torch.Tensor, torch.Tensor],
    frac: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept count and mask of candidates ``vals`` cut with the upper end of the mass
    bracket (``got``), checked against its lower end ``lo``: equal counts mean every
    ``Z`` in the bracket, the exact one included, keeps the same set; the other rows
    are cut again with their exact mass (a full-row pass over those rows only)."""
    n, kept = got
    if torch.equal(lo, cut.total.squeeze(1)):
        return n, kept
    n_lo = filter_ops.kept_prefix(vals, dataclasses.replace(cut, total=lo.unsqueeze(1)), frac)[0]
    amb = (n_lo != n).nonzero().flatten()
    if not amb.numel():
        return n, kept
    exact = filter_ops.survivor_mass(zw.index_select(0, amb), None, frac)
    sub = dataclasses.replace(cut.rows(amb), total=exact.unsqueeze(1))
    n2, kept2, _, _ = filter_ops.kept_prefix(vals[amb], sub, frac)
    n, kept = n.clone(), kept.clone()
    n[amb], kept[amb] = n2, kept2
    return n, kept


def _table(
    idx: torch.Tensor,
    every: bool,
    vals: torch.Tensor,
    ids: torch.Tensor,
    cut: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> Table:
    """The compact table of rows whose kept set is the first ``n`` of their descending
    candidates; ``cut`` = (n, kept, q) of :func:`~detsample.ops.filters.kept_prefix`."""
    n, kept, q = cut
    sorted_ids, csum = draw_ops.id_order_cdf(ids, q, kept)
    return Table(idx, every, csum, sorted_ids, tau=vals.gather(1, (n - 1).unsqueeze(1)).squeeze(1))


def _columns(rows: Rows, plan: RowPlan, inp: CutInputs, frac: int) -> Table:
    """Plain grammar rows drawn over their allowed columns: their compact table (their
    threshold stays ``-inf``, as on the full strategy)."""
    known = inp.column_values
    vals, ids = colcdf.gather_columns(
        inp.x,
        rows.rows,
        [inp.columns[r] for r in rows.rows],
        None if known is None else [known.get(r) for r in rows.rows],
    )
    ids, csum = colcdf.column_cdf(
        vals,
        ids,
        rows.take(inp.shift),
        rows.take(plan.temperatures),
        rows.take(inp.filters[2]),
        frac,
        cut_element=None if plan.any_element else False,
    )
    return Table(rows.index, rows.every, csum, ids)


# -- the full strategy ---------------------------------------------------------------


def _full(
    z: torch.Tensor,
    plan: RowPlan,
    inp: CutInputs,
    plain: Rows,
    spilled: list[torch.Tensor],
    *,
    tau: torch.Tensor,
    frac: int,
) -> Table | None:
    """The blocked table of every row drawn over the vocabulary: the sort's rows and the
    spilled ones (the sort's threshold, or its radix select), the large top-k rows (the
    k-th value) and the plain rows (no threshold); their thresholds land in ``tau``."""
    rt = plan.route
    top_ks, top_ps, element = inp.filters
    sort_idx = ([rt.sort.index] if rt.sort else []) + spilled
    full_idx = list(sort_idx)
    if sort_idx:
        si = torch.cat(sort_idx) if len(sort_idx) > 1 else sort_idx[0]
        zs = z if _in_order(si, plan.size) else z.index_select(0, si)
        args = (zs, top_ks[si], top_ps[si], element[si], frac)
        tau[si] = (
            radix.thresholds_by_select(
                *args,
                out=inp.scratch("w", zs),
                q_out=inp.scratch("q", zs, torch.int64),
                key_out=inp.scratch("k", zs, torch.int64),
            )
            if inp.select
            else filter_ops.thresholds_by_sort(*args)
        )
    if rt.top_k_only:
        ti = rt.top_k_only.index
        tau[ti] = filter_ops.topk_threshold(rt.top_k_only.take(z), top_ks[ti])
        full_idx.append(ti)
    if plain:
        full_idx.append(plain.index)
    if not full_idx:
        return None
    fi = torch.cat(full_idx) if len(full_idx) > 1 else full_idx[0]
    every = _in_order(fi, plan.size)
    zf, tf, ef = (z, tau, element) if every else (z.index_select(0, fi), tau[fi], element[fi])
    q, bsum = draw_ops.block_cdf(
        zf,
        tf,
        ef,
        frac,
        out=inp.scratch("w", zf),
        q_out=inp.scratch("q", zf, torch.int64),
        cut_tau=len(full_idx) > bool(plain),
        cut_element=None if plan.any_element else False,
        lazy=True,
    )
    return Table(fi, every, bsum, q=q)


def _in_order(idx: torch.Tensor, B: int) -> bool:
    """Whether row indices ``idx`` are every row of a B-row batch, in order (then the
    rows need no gather)."""
    return idx.numel() == B and bool(torch.equal(idx, torch.arange(B, dtype=idx.dtype, device=idx.device)))
