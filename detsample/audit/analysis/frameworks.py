"""The metrics RL frameworks log and gate on, computed as they compute them, exactly mergeable.

``d = trainer - engine`` per audited token (the frameworks' ``log_ratio = old_log_prob -
rollout_log_prob``), ``L_s`` the audited tokens of sequence s, ``B`` the valid sequences
(every row of a training batch, those with no audited token included), ``n`` the audited
tokens, ``eps = 1e-8`` (both frameworks divide by ``count + 1e-8``):

* **verl** rollout correction (``verl/trainer/ppo/rollout_corr_helper.py``, verl-project/verl):
  ``compute_is_metrics`` for ``rollout_is="token"`` and ``"sequence"`` at
  ``rollout_is_threshold`` T (truncated IS, weights ``exp(clamp(., -20, 20))``, truncated at
  T, fractions above T and below 1/T, std, ESS, per-sequence statistics);
  ``compute_rollout_rejection_mask`` / ``compute_rs_metrics`` for each ``rollout_rs``
  option (``token_k1..3``, ``seq_sum_k1..3``, ``seq_mean_k1..3``, ``seq_max_k2/3``) at its
  ``rollout_rs_threshold``; ``compute_offpolicy_metrics`` (``kl``, ``k3_kl``, training and
  rollout perplexities, ``log_ppl_diff``, ``ppl_ratio``, ``chi2_token``, ``chi2_seq``);
* **NeMo-RL** ``ClippedPGLossFn`` (``nemo_rl/algorithms/loss_functions.py``, NVIDIA-NeMo/RL):
  ``token_mult_prob_error`` = masked mean of ``exp(|d|)``, ``gen_kl_error`` and
  ``policy_kl_error`` (its k3 KL estimators, unclamped).

Chunks, workers and Ray give the same bits:

* per-sequence values use only that sequence's tokens (one chunk), and their sums over
  sequences are exact integer sums (as in :mod:`detsample.audit.analysis.metrics`), rounded once;
* token-level sums are functions of ``d`` alone: they are summed once, when the report is
  made, over the audit's exact multiset of the non-zero ``d`` (sorted distinct values
  times their counts, :meth:`detsample.audit.analysis.exact.ValueCounts.items`), a canonical order
  whatever the chunking, plus the constant a token with ``d == 0`` contributes
  (``exp(0) = 1``); ``kl`` and the k3 KLs use the audit's exact sums of ``d`` and
  ``expm1(d)``. No token is visited twice for these metrics.

The formulas are the frameworks' own (clamps, truncation, ``+ 1e-8`` denominators, the
unbiased ``torch.std`` of per-sequence values), so values agree with theirs to rounding
(tests/audit/test_frameworks.py re-implements both in torch and compares).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from detsample.audit.analysis.exact import exact_sums, fraction_to_float, to_fraction
from detsample.inputs.numbers import parse_float

SAFETY_BOUND = 20.0  # verl's SAFETY_BOUND: exp is taken of log ratios clamped to [-20, 20]
EPS = 1e-8  # verl_F.masked_mean and NeMo-RL masked_mean divide by (count + 1e-8)
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
VERL_SOURCE = "verl/trainer/ppo/rollout_corr_helper.py (github.com/verl-project/verl)"
NEMO_SOURCE = "nemo_rl/algorithms/loss_functions.py, ClippedPGLossFn (github.com/NVIDIA-NeMo/RL)"
_F_EPS = Fraction(EPS)


def _positive(name: str, text: str) -> float:
    try:
        v = parse_float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {text!r}") from None
    if not 0.0 < v < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {text!r}")
    return v


def parse_rollout_rs(spec: str | None) -> tuple[str, ...]:
    """verl's ``rollout_rs``: comma-separated options (duplicates dropped, order kept)."""
    if spec is None:
        return ()
    out: list[str] = []
    for opt in (o.strip() for o in str(spec).split(",")):
        if not opt:
            continue
        if opt not in RS_OPTIONS:
            raise ValueError(f"rollout_rs option must be one of {', '.join(RS_OPTIONS)}, got {opt!r}")
        if opt not in out:
            out.append(opt)
    if not out:
        raise ValueError(f"rollout_rs must name at least one option, got {spec!r}")
    return tuple(out)


def parse_rs_thresholds(options: tuple[str, ...], spec: str | float) -> tuple[tuple[float | None, float], ...]:
    """verl's ``rollout_rs_threshold`` (``_parse_rollout_rs_thresholds``): one threshold for
    every option or one per option, comma-separated; a ``k1`` option takes ``lower_upper``
    ratio bounds (a single value U means 1/U .. U), the others one upper bound.
    Returns (lower or None, upper) per option."""
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if not parts:
        raise ValueError(f"rollout_rs_threshold must hold at least one threshold, got {spec!r}")
    if len(parts) not in (1, len(options)):
        raise ValueError(
            f"rollout_rs_threshold: give one threshold for all {len(options)} options or one per option, got {spec!r}"
        )
    parts = parts * len(options) if len(parts) == 1 else parts
    out = []
    for opt, p in zip(options, parts):
        if opt.endswith("k1"):
            if p.count("_") > 1:
                raise ValueError(f"rollout_rs_threshold for {opt}: one number or lower_upper (one '_'), got {p!r}")
            lo_text, _, up_text = p.partition("_") if "_" in p else ("", "", p)
            upper = _positive(f"rollout_rs_threshold for {opt}", up_text)
            lower = 1.0 / upper if not lo_text else _positive(f"rollout_rs_threshold for {opt}", lo_text)
            if not lower <= upper:  # an empty band: every token rejected
                raise ValueError(
                    f"rollout_rs_threshold for {opt}: lower_upper needs lower <= "
                    f"upper, got {p!r} ({lower:g} > {upper:g})"
                )
            out.append((lower, upper))
        else:
            if "_" in p:
                raise ValueError(f"rollout_rs_threshold for {opt} is one upper bound, got {p!r}")
            out.append((None, _positive(f"rollout_rs_threshold for {opt}", p)))
    return tuple(out)


@dataclass(frozen=True)
class FrameworkOptions:
    """The frameworks' knobs the metrics depend on, named as they name them (validated).

    rollout_is_threshold: verl's truncated-IS threshold T (> 0; default 2.0, verl's).
    rollout_rs: verl's rejection options, comma-separated (None: no rejection metrics).
    rollout_rs_threshold: verl's thresholds for them (a number, ``lower_upper`` for k1
    options, or one per option, comma-separated)."""

    rollout_is_threshold: float = 2.0
    rollout_rs: str | None = "token_k1"
    rollout_rs_threshold: str | float = "2.0"

    def __post_init__(self) -> None:
        v = self.rollout_is_threshold
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            raise ValueError(f"rollout_is_threshold must be a finite number > 0, got {v!r}")
        object.__setattr__(self, "rollout_is_threshold", float(v))
        opts = parse_rollout_rs(self.rollout_rs)
        if opts:
            parse_rs_thresholds(opts, self.rollout_rs_threshold)

    @property
    def rs(self) -> tuple[tuple[str, float | None, float], ...]:
        """(option, lower or None, upper) per rejection option."""
        opts = parse_rollout_rs(self.rollout_rs)
        if not opts:
            return ()
        return tuple((o, lo, up) for o, (lo, up) in zip(opts, parse_rs_thresholds(opts, self.rollout_rs_threshold)))


class _Sum:
    """An exact sum of float64 values that may hold +inf (counted apart). Values are
    queued by :meth:`add` and summed by :func:`_flush`, many sums in one pass."""

    __slots__ = ("s", "inf", "pending")

    def __init__(self) -> None:
        self.s, self.inf = 0, 0
        self.pending: list[np.ndarray] = []

    def add(self, x: np.ndarray) -> None:
        """Queue ``x`` (finite or +inf; NaN or -inf is a bug of the caller)."""
        x = np.asarray(x, dtype=np.float64)
        if not x.size:
            return
        fin = np.isfinite(x)
        if not fin.all():
            if not (x[~fin] > 0).all():
                raise ValueError("framework metrics: a NaN or -inf term")
            self.inf += int(np.count_nonzero(~fin))
            x = x[fin]
        self.pending.append(x)

    def merge(self, o: _Sum) -> None:
        assert not self.pending and not o.pending
        self.s += o.s
        self.inf += o.inf

    def exact(self) -> Fraction | None:
        """The sum as a rational; None when infinite."""
        assert not self.pending
        return None if self.inf else to_fraction(self.s)

    def __getstate__(self):
        assert not self.pending
        return (self.s, self.inf)

    def __setstate__(self, state) -> None:
        self.s, self.inf = state
        self.pending = []


def _flush(sums: list[_Sum]) -> None:
    """Sum every queued value of ``sums`` exactly, in one grouped pass."""
    busy = [(k, x) for k, sm in enumerate(sums) for x in sm.pending]
    if not busy:
        return
    vals = np.concatenate([x for _, x in busy])
    groups = np.repeat(np.array([k for k, _ in busy], dtype=np.int64), [x.size for _, x in busy])
    for sm, total in zip(sums, exact_sums(vals, groups, len(sums), check=False)):
        sm.s += total
        sm.pending = []


_SPLIT = 134217729.0  # 2**27 + 1: Veltkamp's split of a float64 into two 26-bit halves


def _square_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three float64 arrays whose exact sum is x**2 (Dekker: x = h + l with h and l of 26
    significant bits, so h*h, 2*h*l and l*l are exact); beyond 1e150 x**2 itself (inf
    or near it, where a variance means nothing anyway)."""
    with np.errstate(over="ignore", invalid="ignore"):
        big = np.abs(x) > 1e150
        small = np.where(big, 0.0, x)
        t = _SPLIT * small
        h = t - (t - small)
        lo = small - h
        return np.where(big, x * x, h * h), 2.0 * h * lo, lo * lo


def _hi(x: np.ndarray, cur: float) -> float:
    return max(cur, float(x.max()) + 0.0) if x.size else cur  # + 0.0: -0.0 is 0.0


def _lo(x: np.ndarray, cur: float) -> float:
    return min(cur, float(x.min()) + 0.0) if x.size else cur


class _Stats:
    """Per-sequence values (or a per-sequence value on each of its tokens, ``weights``):
    exact sum, sum of squares (exact for unweighted values: a variance of close values
    cancels), max, min and count; exactly mergeable."""

    __slots__ = ("sum", "sq", "hi", "lo", "count")

    def __init__(self) -> None:
        self.sum, self.sq = _Sum(), _Sum()
        self.hi, self.lo, self.count = -math.inf, math.inf, 0

    def add(self, x: np.ndarray, weights: np.ndarray | None = None) -> None:
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            if weights is not None:  # x * w and x * x * w, rounded per sequence
                w = np.asarray(weights, dtype=np.float64)
                x, w = x[w != 0], w[w != 0]
                self.sum.add(x * w)
                self.sq.add(np.where(np.isinf(x), np.inf, x * x * w))
                self.count += int(w.sum())
            else:
                self.sum.add(x)
                for part in _square_parts(x):
                    self.sq.add(part)
                self.count += int(x.size)
        self.hi, self.lo = _hi(x, self.hi), _lo(x, self.lo)

    def merge(self, o: _Stats) -> None:
        self.sum.merge(o.sum)
        self.sq.merge(o.sq)
        self.hi, self.lo, self.count = max(self.hi, o.hi), min(self.lo, o.lo), self.count + o.count

    def totals(self) -> _Totals:
        return _Totals(self.sum.exact(), self.sq.exact(), self.hi, self.lo)


@dataclass(frozen=True)
class _Totals:
    """Sum, sum of squares (None: infinite), max and min of values over tokens or rows."""

    s1: Fraction | None
    s2: Fraction | None
    hi: float
    lo: float


def _multiset_totals(f: np.ndarray, counts: np.ndarray, zero_value: float, zeros: int, squares: bool = True) -> _Totals:
    """Totals of a function of d over the audited tokens: ``f`` at the distinct non-zero
    d (ascending), ``counts`` of each, and ``zero_value`` on each of the ``zeros`` tokens
    with d == 0. Summed in this canonical order (the same bits for every chunking);
    ``squares=False`` skips the sum of squares (None)."""

    cf = counts.astype(np.float64)

    def total(t: float, c: float) -> Fraction | None:
        if math.isnan(t):
            raise ValueError("framework metrics: a NaN term")
        if math.isinf(t) or math.isinf(c):
            return None
        return Fraction(t) + Fraction(c) * zeros

    hi = _hi(f, -math.inf)
    lo = _lo(f, math.inf)
    if zeros:
        hi, lo = max(hi, zero_value + 0.0), min(lo, zero_value + 0.0)
    with np.errstate(over="ignore", invalid="ignore"):  # einsum: one fixed order, no temporary
        s1 = total(float(np.einsum("i,i->", f, cf)), zero_value)
        s2 = total(float(np.einsum("i,i,i->", f, f, cf)), zero_value * zero_value) if squares else None
    return _Totals(s1, s2, hi, lo)


def _count(mask: np.ndarray, counts: np.ndarray, zero_hit: bool, zeros: int) -> int:
    """How many audited tokens satisfy a condition: ``mask`` at the distinct non-zero d,
    ``zero_hit`` for the tokens with d == 0."""
    return int(counts.sum(where=mask)) + (zeros if zero_hit else 0)


def _over(value: Fraction | None, denom: Fraction) -> float:
    """``value / denom`` rounded once; inf when the sum was infinite."""
    if value is None:
        return math.inf
    return fraction_to_float(value / denom)


def _std_eps(t: _Totals, n: int) -> float:
    """verl's std: sqrt(max(E[x^2] - E[x]^2, 0)) with E = masked_mean; 0 for n <= 1."""
    if n <= 1:
        return 0.0
    if t.s1 is None or t.s2 is None:
        return math.inf
    var = t.s2 / (n + _F_EPS) - (t.s1 / (n + _F_EPS)) ** 2
    return math.sqrt(max(fraction_to_float(var), 0.0))


def _std_unbiased(st: _Stats) -> float:
    """torch.std (unbiased) of the values, 0 for one value (verl: ``if numel() > 1``)."""
    m = st.count
    if m <= 1:
        return 0.0
    s1, s2 = st.sum.exact(), st.sq.exact()
    if s1 is None or s2 is None:
        return math.inf
    return math.sqrt(max(fraction_to_float((s2 - s1 * s1 / m) / (m - 1)), 0.0))


def _ess(t: _Totals, n: int) -> float:
    """verl's ESS: 1 / masked_mean((w / (masked_mean(w) + 1e-8))^2)
    = (n + eps) (mean + 1e-8)^2 / sum w^2."""
    if t.s1 is None or t.s2 is None:
        return math.inf
    if t.s2 == 0:
        return math.nan
    mean = t.s1 / (n + _F_EPS)
    return fraction_to_float((n + _F_EPS) * (mean + _F_EPS) ** 2 / t.s2)


class _RowStats:
    """Per-row statistics verl reports as ``*_seq_*``: values, max |value - center|, and
    the rows above ``hi`` / below ``lo`` (exactly mergeable)."""

    def __init__(self) -> None:
        self.values = _Stats()
        self.dev = 0.0
        self.above = 0
        self.below = 0

    def add(self, v: np.ndarray, center: float, hi: float, lo: float | None, raw: np.ndarray | None = None) -> None:
        """``raw``: the values the thresholds are read on, when not ``v`` itself."""
        self.values.add(v)
        if v.size:
            self.dev = max(self.dev, float(np.abs(v - center).max()))
        r = v if raw is None else raw
        self.above += int(np.count_nonzero(r > hi))
        if lo is not None:
            self.below += int(np.count_nonzero(r < lo))

    def merge(self, o: _RowStats) -> None:
        self.values.merge(o.values)
        self.dev = max(self.dev, o.dev)
        self.above += o.above
        self.below += o.below


class _SeqIS:
    """What verl's compute_is_metrics needs beyond the token totals, per level."""

    def __init__(self) -> None:
        self.rows = _RowStats()  # per-row mean truncated weight (raw for the fractions)
        self.w = _Stats()  # sequence level: the row weight on each of its tokens
        self.log_hi = -math.inf  # sequence level: max / min log weight over all rows
        self.log_lo = math.inf
        self.above = 0  # sequence level: rows with log weight > log T
        self.below = 0

    def merge(self, o: _SeqIS) -> None:
        self.rows.merge(o.rows)
        self.w.merge(o.w)
        self.log_hi, self.log_lo = max(self.log_hi, o.log_hi), min(self.log_lo, o.log_lo)
        self.above += o.above
        self.below += o.below


def _is_report(level: str, tok: _Totals, hi: float, lo: float, seq: _SeqIS, n: int, rows: int) -> dict:
    """verl compute_is_metrics' keys. ``tok``: totals of the truncated weights over the
    tokens; ``hi`` / ``lo``: (token level) the fractions' numerators."""
    p = "rollout_corr/rollout_is"
    out = {f"{p}_mean": _over(tok.s1, n + _F_EPS)}
    if level == "sequence":
        out[f"{p}_max"] = math.exp(min(seq.log_hi, SAFETY_BOUND))
        out[f"{p}_min"] = math.exp(seq.log_lo) if seq.log_lo < 709 else math.inf
        out[f"{p}_ratio_fraction_high"] = seq.above / rows
        out[f"{p}_ratio_fraction_low"] = seq.below / rows
    else:
        out[f"{p}_ratio_fraction_high"] = _over(Fraction(hi), n + _F_EPS)
        out[f"{p}_ratio_fraction_low"] = _over(Fraction(lo), n + _F_EPS)
        out[f"{p}_max"], out[f"{p}_min"] = tok.hi, tok.lo
    out[f"{p}_std"] = _std_eps(tok, n)
    out[f"{p}_eff_sample_size"] = _ess(tok, n)
    r = seq.rows
    out[f"{p}_seq_mean"] = _over(r.values.sum.exact(), Fraction(rows))
    out[f"{p}_seq_std"] = _std_unbiased(r.values)
    out[f"{p}_seq_max"], out[f"{p}_seq_min"] = r.values.hi, r.values.lo
    out[f"{p}_seq_max_deviation"] = r.dev
    out[f"{p}_seq_fraction_high"] = r.above / rows
    out[f"{p}_seq_fraction_low"] = r.below / rows
    return out


class _RS:
    """verl compute_rs_metrics and the masked fractions of one rejection option."""

    def __init__(self, option: str, lower: float | None, upper: float) -> None:
        self.option = option
        self.k1 = option.endswith("k1")
        self.level = "token" if option.startswith("token") else "sequence"
        self.lower_log = math.log(lower) if self.k1 else None  # type: ignore[arg-type]
        self.upper_log = math.log(upper) if self.k1 else None
        self.upper = upper
        self.thr_hi = self.upper_log if self.k1 else upper  # metrics_upper_threshold
        self.thr_lo = self.lower_log if self.k1 else 0.0  # metrics_lower_threshold
        self.stat = _Stats()  # sequence options: the row statistic on each token
        self.clamped = _Stats()
        self.rejected = 0  # sequence options: tokens rejected
        self.rows = _RowStats()  # per valid row: its statistic (or mean token statistic)
        self.rows_rejected = 0  # valid rows with a rejected token

    def keep(self, stat):
        if self.k1:
            return (stat >= self.lower_log) & (stat <= self.upper_log)
        return stat <= self.upper

    def clamp(self, stat):
        return np.clip(stat, self.thr_lo, self.thr_hi)

    def merge(self, o: _RS) -> None:
        for name in ("stat", "clamped", "rows"):
            getattr(self, name).merge(getattr(o, name))
        self.rejected += o.rejected
        self.rows_rejected += o.rows_rejected

    def report(self, vals: np.ndarray, counts: np.ndarray, zeros: int, n: int, valid: int) -> dict:
        p = f"rollout_corr/rollout_rs_{self.option}"
        if self.level == "token":
            stat = _token_stat(self.option, np.clip(vals, -SAFETY_BOUND, SAFETY_BOUND))
            tok = _multiset_totals(stat, counts, 0.0, zeros)
            clamped = _multiset_totals(self.clamp(stat), counts, float(self.clamp(0.0)), zeros)
            rejected = _count(~self.keep(stat), counts, not bool(self.keep(0.0)), zeros)
        else:
            tok, clamped, rejected = self.stat.totals(), self.clamped.totals(), self.rejected
        out = {f"{p}_mean": _over(tok.s1, n + _F_EPS)}
        rv = self.rows.values
        if self.level == "sequence" and valid:
            out[f"{p}_max"], out[f"{p}_min"] = rv.hi, rv.lo
            out[f"{p}_fraction_high"] = self.rows.above / valid
            out[f"{p}_fraction_low"] = self.rows.below / valid if self.k1 else 0.0
        else:
            out[f"{p}_max"], out[f"{p}_min"] = tok.hi, tok.lo
            hi = _count(stat > self.thr_hi, counts, self.thr_hi < 0.0, zeros)
            out[f"{p}_fraction_high"] = _over(Fraction(hi), n + _F_EPS)
            lo = _count(stat < self.thr_lo, counts, self.thr_lo > 0.0, zeros) if self.k1 else 0
            out[f"{p}_fraction_low"] = _over(Fraction(lo), n + _F_EPS) if self.k1 else 0.0
        out[f"{p}_std"] = _std_eps(clamped, n)
        if valid:
            out.update(self._seq_stats(p, valid))
        out[f"{p}_masked_fraction"] = _over(Fraction(rejected), n + _F_EPS)
        out[f"{p}_seq_masked_fraction"] = self.rows_rejected / valid if valid else 0.0
        return out

    def _seq_stats(self, p: str, valid: int) -> dict:
        """The per-sequence statistics (``valid`` > 0 sequences), under prefix ``p``."""
        rv = self.rows.values
        out = {
            f"{p}_seq_mean": _over(rv.sum.exact(), Fraction(valid)),
            f"{p}_seq_std": _std_unbiased(rv),
            f"{p}_seq_max": rv.hi,
            f"{p}_seq_min": rv.lo,
            f"{p}_seq_max_deviation": self.rows.dev,
            f"{p}_seq_fraction_high": self.rows.above / valid,
        }
        if self.k1:
            out[f"{p}_seq_fraction_low"] = self.rows.below / valid
        return out


def _token_stat(option: str, cd: np.ndarray) -> np.ndarray:
    """verl's token_k1 / k2 / k3 of the clamped log ratio."""
    k = option[-2:]
    if k == "k1":
        return -cd
    if k == "k2":
        return 0.5 * cd**2
    return np.exp(cd) - 1.0 - cd


_PPL_KEYS = (
    "training_ppl",
    "training_log_ppl",
    "rollout_ppl",
    "rollout_log_ppl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "ppl_ratio",
    "chi2_seq",
)


class FrameworkAccumulator:
    """The verl and NeMo-RL metrics of the audited tokens: per-sequence parts updated
    chunk by chunk and merged exactly; token-level parts read off the audit's multiset of
    d when the report is made (see the module docstring)."""

    def __init__(self, options: FrameworkOptions | None = None) -> None:
        self.options = options or FrameworkOptions()
        self.n = 0  # audited tokens
        self.rows = 0  # valid sequences (B)
        self.valid = 0  # valid sequences with an audited token
        self.is_token, self.is_seq = _SeqIS(), _SeqIS()
        self.rs = [_RS(o, lo, up) for o, lo, up in self.options.rs]
        self.rs_rejected = 0  # tokens rejected by some option
        self.rs_rows = 0  # rows with a rejected token
        self.ppl = {k: _Sum() for k in _PPL_KEYS}
        self.diff_hi, self.diff_lo = -math.inf, math.inf

    # -------------------------------------------------------------- updating

    def update(
        self, ntok: np.ndarray, e: np.ndarray, t: np.ndarray, dn: np.ndarray, seq_nz: np.ndarray, seq_d: np.ndarray
    ) -> None:
        """One chunk: ``ntok`` [S] audited tokens per valid sequence; ``e`` / ``t`` [n]
        the audited logprobs (as compared); ``dn`` [K] the non-zero d in token order and
        ``seq_nz`` [K] their sequences; ``seq_d`` [S] the sum of d per sequence."""
        nseq = int(ntok.size)
        self.rows += nseq
        self.n += int(ntok.sum())
        self.valid += int(np.count_nonzero(ntok))
        if nseq == 0:
            return
        has = ntok > 0
        starts = np.zeros(nseq, dtype=np.int64)
        np.cumsum(ntok[:-1], out=starts[1:])
        sum_t, sum_e = np.zeros(nseq), np.zeros(nseq)
        if has.any():
            sum_e[has] = np.add.reduceat(e, starts[has], dtype=np.float64)
            if dn.size:
                sum_t[has] = np.add.reduceat(t, starts[has], dtype=np.float64)
            else:  # every d == 0: t equals e value for value, so do the row sums
                sum_t = sum_e.copy()
        zeros = ntok - np.bincount(seq_nz, minlength=nseq)
        cd = np.clip(dn, -SAFETY_BOUND, SAFETY_BOUND)
        with np.errstate(over="ignore", invalid="ignore"):
            self._update_is(cd, seq_nz, seq_d, ntok, zeros)
            clamped = cd.size and (dn.max() > SAFETY_BOUND or dn.min() < -SAFETY_BOUND)
            self._update_rs(cd, seq_nz, ntok, zeros, has, None if clamped else seq_d)
            self._update_offpolicy(sum_t, sum_e, seq_d, ntok)
        _flush(self._sums())

    def _sums(self) -> list[_Sum]:
        """Every exact sum this accumulator keeps (for :func:`_flush`)."""
        stats = [self.is_token.rows.values, self.is_seq.rows.values, self.is_seq.w]
        for r in self.rs:
            stats += [r.stat, r.clamped, r.rows.values]
        return [x for st in stats for x in (st.sum, st.sq)] + list(self.ppl.values())

    def _update_is(self, cd, seq_nz, seq_d, ntok, zeros) -> None:
        thr = self.options.rollout_is_threshold
        nseq = ntok.size
        raw = np.exp(cd)
        w1 = min(1.0, thr)  # the truncated weight of a token with d == 0
        seq_raw = np.bincount(seq_nz, weights=raw, minlength=nseq) + zeros * 1.0
        if (raw > thr).any():
            seq_w = np.bincount(seq_nz, weights=np.minimum(raw, thr), minlength=nseq) + zeros * w1
        else:  # nothing truncated: the same sums
            seq_w = seq_raw if w1 == 1.0 else seq_raw - zeros * (1.0 - w1)
        self.is_token.rows.add(seq_w / (ntok + EPS), 1.0, thr, 1.0 / thr, seq_raw / (ntok + EPS))
        iq = self.is_seq  # one weight exp(clamp(S_s)) per row, on each of its tokens
        raw_s = np.exp(np.clip(seq_d, -SAFETY_BOUND, SAFETY_BOUND))
        w_s = np.minimum(raw_s, thr)
        iq.w.add(w_s, weights=ntok)
        iq.log_hi, iq.log_lo = _hi(seq_d, iq.log_hi), _lo(seq_d, iq.log_lo)
        iq.above += int(np.count_nonzero(seq_d > math.log(thr)))
        iq.below += int(np.count_nonzero(seq_d < math.log(1.0 / thr)))
        iq.rows.add(ntok * w_s / (ntok + EPS), 1.0, thr, 1.0 / thr, ntok * raw_s / (ntok + EPS))

    def _update_rs(self, cd, seq_nz, ntok, zeros, has, seq_d) -> None:
        """``seq_d``: the rows' sums of d when no d was clamped (then -seq_d is token_k1's
        row sum, the same bits as summing -clamp(d)), else None."""
        if not self.rs:
            return
        nseq = ntok.size
        rejected_tok = np.zeros(cd.size, dtype=bool)  # non-zero d rejected by a token option
        rejected_zero = False  # d == 0 rejected by a token option
        rejected_seq = np.zeros(nseq, dtype=bool)  # rows rejected whole
        bounds = np.flatnonzero(np.r_[True, seq_nz[1:] != seq_nz[:-1]]) if seq_nz.size else np.zeros(0, dtype=np.int64)
        for r in self.rs:
            stat = _token_stat(r.option, cd)
            if r.level == "token":
                keep = r.keep(stat)
                keep0 = bool(r.keep(0.0))
                rej = np.bincount(seq_nz[~keep], minlength=nseq) + (0 if keep0 else zeros)
                if r.option == "token_k1" and seq_d is not None:  # -sum(d), as summed
                    row_val = -seq_d / (ntok + EPS)
                else:
                    row_val = np.bincount(seq_nz, weights=stat, minlength=nseq) / (ntok + EPS)
                rejected_tok |= ~keep
                rejected_zero |= not keep0
            else:
                if r.option.startswith("seq_max"):
                    per = np.where(zeros > 0, 0.0, -np.inf)  # a token with d == 0 has stat 0
                    if bounds.size:
                        rows = seq_nz[bounds]
                        per[rows] = np.maximum(per[rows], np.maximum.reduceat(stat, bounds))
                    per = np.where(np.isneginf(per), 0.0, per)
                else:
                    per = np.bincount(seq_nz, weights=stat, minlength=nseq)
                    if r.option.startswith("seq_mean"):
                        per = per / (ntok + EPS)
                keep_s = r.keep(per)
                r.stat.add(per, weights=ntok)
                r.clamped.add(r.clamp(per), weights=ntok)
                rej = np.where(keep_s, 0, ntok)
                r.rejected += int(rej.sum())
                row_val = per
                rejected_seq |= ~keep_s & has
            r.rows.add(row_val[has], 0.0, r.thr_hi, r.thr_lo if r.k1 else None)
            r.rows_rejected += int(np.count_nonzero(rej[has] > 0))
        per_row = np.bincount(seq_nz, weights=rejected_tok, minlength=nseq) + (zeros if rejected_zero else 0)
        per_row = np.where(rejected_seq, ntok, per_row)
        self.rs_rejected += int(per_row.sum())
        self.rs_rows += int(np.count_nonzero(per_row > 0))

    def _update_offpolicy(self, sum_t, sum_e, seq_d, ntok) -> None:
        mt = sum_t / (ntok + EPS)
        me = sum_e / (ntok + EPS)
        diff = me - mt
        for key, x in (
            ("training_ppl", np.exp(-mt)),
            ("training_log_ppl", -mt),
            ("rollout_ppl", np.exp(-me)),
            ("rollout_log_ppl", -me),
            ("log_ppl_diff", diff),
            ("log_ppl_abs_diff", np.abs(diff)),
            ("ppl_ratio", np.exp(diff)),
            ("chi2_seq", np.exp(2.0 * np.clip(seq_d, -SAFETY_BOUND, SAFETY_BOUND))),
        ):
            self.ppl[key].add(x)
        self.diff_hi, self.diff_lo = _hi(diff, self.diff_hi), _lo(diff, self.diff_lo)

    def merge(self, o: FrameworkAccumulator) -> None:
        if o.options != self.options:
            raise ValueError(f"cannot merge framework metrics of {o.options} and {self.options}")
        self.n += o.n
        self.rows += o.rows
        self.valid += o.valid
        self.is_token.merge(o.is_token)
        self.is_seq.merge(o.is_seq)
        for a, b in zip(self.rs, o.rs):
            a.merge(b)
        self.rs_rejected += o.rs_rejected
        self.rs_rows += o.rs_rows
        for k, v in o.ppl.items():
            self.ppl[k].merge(v)
        self.diff_hi, self.diff_lo = max(self.diff_hi, o.diff_hi), min(self.diff_lo, o.diff_lo)

    # -------------------------------------------------------------- the report

    def _offpolicy(self, d: Fraction, k3: Fraction | None, rho2: Fraction | None) -> dict:
        """verl's off-policy diagnostics (rollout_corr/...): ``d`` the exact sum of d, ``k3``
        of expm1(d) - d, ``rho2`` of rho^2 - 1 (None: infinite)."""
        n, denom, fr = self.n, self.n + _F_EPS, Fraction(self.rows)
        chi2_seq = self.ppl["chi2_seq"].exact()
        return {
            "rollout_corr/training_ppl": _over(self.ppl["training_ppl"].exact(), fr),
            "rollout_corr/training_log_ppl": _over(self.ppl["training_log_ppl"].exact(), fr),
            "rollout_corr/kl": _over(-d, denom),
            "rollout_corr/k3_kl": _over(k3, denom),
            "rollout_corr/rollout_ppl": _over(self.ppl["rollout_ppl"].exact(), fr),
            "rollout_corr/rollout_log_ppl": _over(self.ppl["rollout_log_ppl"].exact(), fr),
            "rollout_corr/log_ppl_diff": _over(self.ppl["log_ppl_diff"].exact(), fr),
            "rollout_corr/log_ppl_abs_diff": _over(self.ppl["log_ppl_abs_diff"].exact(), fr),
            "rollout_corr/log_ppl_diff_max": self.diff_hi,
            "rollout_corr/log_ppl_diff_min": self.diff_lo,
            "rollout_corr/ppl_ratio": _over(self.ppl["ppl_ratio"].exact(), fr),
            "rollout_corr/chi2_token": math.inf if rho2 is None else fraction_to_float((n + rho2) / denom - 1),
            "rollout_corr/chi2_seq": math.inf if chi2_seq is None else fraction_to_float(chi2_seq / fr - 1),
        }

    def report(self, d_values, zeros: int, sum_d: int, sum_u: int | None) -> dict:
        """{"verl": {...}, "nemo_rl": {...}}: each framework's metrics under its own names
        (None where nothing was audited). ``d_values``: the audit's ValueCounts of the
        non-zero d; ``zeros``: its tokens with d == 0; ``sum_d`` / ``sum_u``: its exact
        sums of d and expm1(d) (scaled integers; ``sum_u`` None when infinite)."""
        n, rows = self.n, self.rows
        opts = self.options
        config = {
            "rollout_is_threshold": opts.rollout_is_threshold,
            "rollout_rs": opts.rollout_rs,
            "rollout_rs_threshold": str(opts.rollout_rs_threshold),
        }
        verl = {"source": VERL_SOURCE, "config": config}
        nemo = {"source": NEMO_SOURCE}
        if n == 0:
            verl.update(rollout_is_token=None, rollout_is_sequence=None, rollout_rs=None, offpolicy=None)
            nemo.update(token_mult_prob_error=None, gen_kl_error=None, policy_kl_error=None)
            return {"verl": verl, "nemo_rl": nemo}
        vals, counts = d_values.items()
        denom = n + _F_EPS
        thr = opts.rollout_is_threshold
        with np.errstate(over="ignore", invalid="ignore"):
            raw = np.exp(np.clip(vals, -SAFETY_BOUND, SAFETY_BOUND))
            w = _multiset_totals(np.minimum(raw, thr), counts, min(1.0, thr), zeros)
            hi = _count(raw > thr, counts, thr < 1.0, zeros)
            lo = _count(raw < 1.0 / thr, counts, 1.0 / thr > 1.0, zeros)
            rho2 = _multiset_totals(raw * raw - 1.0, counts, 0.0, zeros, False).s1
            mult = _multiset_totals(np.expm1(np.abs(vals)), counts, 0.0, zeros, False).s1
            rev = _multiset_totals(np.expm1(-vals), counts, 0.0, zeros, False).s1
        d = to_fraction(sum_d)
        k3 = None if sum_u is None else to_fraction(sum_u) - d  # sum (expm1(d) - d)
        verl["rollout_is_token"] = _is_report("token", w, hi, lo, self.is_token, n, rows)
        verl["rollout_is_sequence"] = _is_report("sequence", self.is_seq.w.totals(), 0, 0, self.is_seq, n, rows)
        rs = None
        if self.rs:
            rs = {}
            for r in self.rs:
                rs.update(r.report(vals, counts, zeros, n, self.valid))
            rs["rollout_corr/rollout_rs_masked_fraction"] = _over(Fraction(self.rs_rejected), denom)
            rs["rollout_corr/rollout_rs_seq_masked_fraction"] = self.rs_rows / rows
        verl["rollout_rs"] = rs
        verl["offpolicy"] = self._offpolicy(d, k3, rho2)
        nemo["token_mult_prob_error"] = math.inf if mult is None else fraction_to_float((n + mult) / denom)
        nemo["gen_kl_error"] = _over(k3, denom)
        nemo["policy_kl_error"] = _over(None if rev is None else rev + d, denom)
        return {"verl": verl, "nemo_rl": nemo}
