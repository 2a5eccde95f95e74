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
  ``policy_kl_error`` (k3), ``js_divergence_error``.

Exactness: every sum over tokens or sequences is an exact integer sum (as in
:mod:`detsample.audit.metrics`), every per-sequence value uses only that sequence's tokens,
and the means are rounded once, so chunks, workers and Ray give the same bits. Tokens with
``d == 0`` contribute the constants they would (``exp(0) = 1``) without being visited.
The formulas are the frameworks' own (clamps, truncation, ``+ 1e-8`` denominators, the
unbiased ``torch.std`` of per-sequence values); the float sums they round as they go are
exact here, so values agree with theirs to rounding (tests/audit/test_frameworks.py
re-implements both in torch and compares).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from detsample.audit.exact import exact_sums, fraction_to_float, to_fraction

SAFETY_BOUND = 20.0  # verl's SAFETY_BOUND: exp is taken of log ratios clamped to [-20, 20]
EPS = 1e-8  # verl_F.masked_mean and NeMo-RL masked_mean divide by (count + 1e-8)
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
VERL_SOURCE = "verl/trainer/ppo/rollout_corr_helper.py (github.com/verl-project/verl)"
NEMO_SOURCE = "nemo_rl/algorithms/loss_functions.py, ClippedPGLossFn (github.com/NVIDIA-NeMo/RL)"
_F_EPS = Fraction(EPS)


def _positive(name: str, text: str) -> float:
    try:
        v = float(text)
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
            raise ValueError(f"rollout_rs option must be one of {', '.join(RS_OPTIONS)}, got "
                             f"{opt!r}")
        if opt not in out:
            out.append(opt)
    if not out:
        raise ValueError(f"rollout_rs must name at least one option, got {spec!r}")
    return tuple(out)


def parse_rs_thresholds(options: tuple[str, ...], spec: str | float
                        ) -> tuple[tuple[float | None, float], ...]:
    """verl's ``rollout_rs_threshold`` (``_parse_rollout_rs_thresholds``): one threshold for
    every option or one per option, comma-separated; a ``k1`` option takes ``lower_upper``
    ratio bounds (a single value U means 1/U .. U), the others one upper bound.
    Returns (lower or None, upper) per option."""
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if not parts:
        raise ValueError(f"rollout_rs_threshold must hold at least one threshold, got {spec!r}")
    if len(parts) not in (1, len(options)):
        raise ValueError(f"rollout_rs_threshold: give one threshold for all {len(options)} "
                         f"options or one per option, got {spec!r}")
    parts = parts * len(options) if len(parts) == 1 else parts
    out = []
    for opt, p in zip(options, parts):
        if opt.endswith("k1"):
            lo_text, _, up_text = p.partition("_") if "_" in p else ("", "", p)
            upper = _positive(f"rollout_rs_threshold for {opt}", up_text)
            lower = 1.0 / upper if not lo_text else _positive(f"rollout_rs_threshold for {opt}",
                                                             lo_text)
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
        return tuple((o, lo, up) for o, (lo, up) in
                     zip(opts, parse_rs_thresholds(opts, self.rollout_rs_threshold)))


class _Sum:
    """An exact sum of float64 values that may hold +inf (counted apart)."""

    __slots__ = ("s", "inf")

    def __init__(self) -> None:
        self.s, self.inf = 0, 0

    def add(self, x: np.ndarray, const: float | None = None, times: int = 0) -> None:
        """Add ``x`` (finite or +inf; NaN or -inf is a bug of the caller) and ``times``
        copies of ``const``."""
        x = np.asarray(x, dtype=np.float64)
        if x.size:
            fin = np.isfinite(x)
            if fin.all():
                self.s += exact_sums(x, check=False)[0]
            else:
                if not (x[~fin] > 0).all():
                    raise ValueError("framework metrics: a NaN or -inf term")
                self.s += exact_sums(x[fin], check=False)[0]
                self.inf += int(np.count_nonzero(~fin))
        if times and const is not None:
            if math.isinf(const):
                self.inf += times
            else:
                self.s += exact_sums(np.array([const]), check=False)[0] * times

    def merge(self, o: "_Sum") -> None:
        self.s += o.s
        self.inf += o.inf

    def exact(self) -> Fraction | None:
        """The sum as a rational; None when infinite."""
        return None if self.inf else to_fraction(self.s)


_SPLIT = 134217729.0  # 2**27 + 1: Veltkamp's split of a float64 into two 26-bit halves


def _square_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three float64 arrays whose exact sum is x**2 (Dekker: x = h + l with h and l of 26
    significant bits, so h*h, 2*h*l and l*l are exact); beyond 1e150 x**2 itself (inf
    or near it, where a variance means nothing anyway)."""
    with np.errstate(over="ignore", invalid="ignore"):
        big = np.abs(x) > 1e150
        t = _SPLIT * np.where(big, 0.0, x)
        h = t - (t - np.where(big, 0.0, x))
        lo = np.where(big, 0.0, x) - h
        return np.where(big, x * x, h * h), 2.0 * h * lo, lo * lo


class _Stats:
    """Sum, sum of squares, max and min of a stream of values (exact, mergeable)."""

    __slots__ = ("sum", "sq", "hi", "lo", "count")

    def __init__(self) -> None:
        self.sum, self.sq = _Sum(), _Sum()
        self.hi, self.lo, self.count = -math.inf, math.inf, 0

    def add(self, x: np.ndarray, const: float | None = None, times: int = 0,
            weights: np.ndarray | None = None) -> None:
        """Values ``x`` (each counted ``weights`` times), plus ``const`` ``times`` times."""
        x = np.asarray(x, dtype=np.float64)
        if weights is not None:  # each value on each of its tokens
            x = np.repeat(x, np.asarray(weights, dtype=np.int64))
        self.sum.add(x, const, times)
        for part, cpart in zip(_square_parts(x), _square_parts(np.array([const or 0.0]))):
            self.sq.add(part, float(cpart[0]) if const is not None else None, times)
        if x.size:  # + 0.0: -0.0 and 0.0 are one value, whatever the order they come in
            self.hi = max(self.hi, float(x.max()) + 0.0)
            self.lo = min(self.lo, float(x.min()) + 0.0)
        if times and const is not None:
            self.hi, self.lo = max(self.hi, const + 0.0), min(self.lo, const + 0.0)
        self.count += int(x.size) + times

    def merge(self, o: "_Stats") -> None:
        self.sum.merge(o.sum)
        self.sq.merge(o.sq)
        self.hi, self.lo, self.count = max(self.hi, o.hi), min(self.lo, o.lo), self.count + o.count


def _over(value: Fraction | None, denom: Fraction) -> float | None:
    """``value / denom`` rounded once; inf when the sum was infinite."""
    if value is None:
        return math.inf
    return fraction_to_float(value / denom)


def _masked_mean(s: _Sum, n: int) -> float:
    """verl_F.masked_mean / NeMo-RL masked_mean: sum / (count + 1e-8)."""
    return _over(s.exact(), n + _F_EPS)


def _std_eps(st: _Stats, n: int) -> float:
    """verl's std: sqrt(max(E[x^2] - E[x]^2, 0)) with E = masked_mean; 0 for n <= 1."""
    if n <= 1:
        return 0.0
    m1, m2 = st.sum.exact(), st.sq.exact()
    if m1 is None or m2 is None:
        return math.inf
    var = m2 / (n + _F_EPS) - (m1 / (n + _F_EPS)) ** 2
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


def _ess(st: _Stats, n: int) -> float:
    """verl's ESS: 1 / masked_mean((w / (masked_mean(w) + 1e-8))^2)
    = (n + eps) (mean + 1e-8)^2 / sum w^2."""
    s1, s2 = st.sum.exact(), st.sq.exact()
    if s1 is None or s2 is None or s2 == 0:
        return math.nan if s2 == 0 else math.inf
    mean = s1 / (n + _F_EPS)
    return fraction_to_float((n + _F_EPS) * (mean + _F_EPS) ** 2 / s2)


class _IS:
    """verl compute_is_metrics for one aggregation level (token or sequence)."""

    def __init__(self) -> None:
        self.w = _Stats()         # truncated weights, per token (max/min: token level)
        self.hi_tok = 0           # token level: raw weight > T
        self.lo_tok = 0           # token level: raw weight < 1/T
        self.seq_log_hi = -math.inf  # sequence level: max / min of the log weights (all rows)
        self.seq_log_lo = math.inf
        self.hi_seq = 0           # sequence level: log weight > log T (all rows)
        self.lo_seq = 0
        self.seq = _Stats()       # per-row mean truncated weight
        self.seq_dev = 0.0        # max |seq mean - 1|
        self.seq_hi = 0           # per-row raw mean weight > T
        self.seq_lo = 0

    def merge(self, o: "_IS") -> None:
        self.w.merge(o.w)
        self.seq.merge(o.seq)
        self.hi_tok += o.hi_tok
        self.lo_tok += o.lo_tok
        self.seq_log_hi, self.seq_log_lo = max(self.seq_log_hi, o.seq_log_hi), \
            min(self.seq_log_lo, o.seq_log_lo)
        self.hi_seq += o.hi_seq
        self.lo_seq += o.lo_seq
        self.seq_dev = max(self.seq_dev, o.seq_dev)
        self.seq_hi += o.seq_hi
        self.seq_lo += o.seq_lo

    def add_rows(self, seq_w: np.ndarray, seq_raw: np.ndarray, thr: float) -> None:
        self.seq.add(seq_w)
        if seq_w.size:
            self.seq_dev = max(self.seq_dev, float(np.abs(seq_w - 1.0).max()))
        self.seq_hi += int(np.count_nonzero(seq_raw > thr))
        self.seq_lo += int(np.count_nonzero(seq_raw < 1.0 / thr))

    def report(self, level: str, n: int, rows: int) -> dict:
        if n == 0:
            return {}
        p = "rollout_corr/rollout_is"
        out = {f"{p}_mean": _masked_mean(self.w.sum, n)}
        if level == "sequence":
            out[f"{p}_max"] = math.exp(min(self.seq_log_hi, SAFETY_BOUND))
            out[f"{p}_min"] = math.exp(self.seq_log_lo) if self.seq_log_lo < 709 else math.inf
            out[f"{p}_ratio_fraction_high"] = self.hi_seq / rows
            out[f"{p}_ratio_fraction_low"] = self.lo_seq / rows
        else:
            out[f"{p}_ratio_fraction_high"] = _over(Fraction(self.hi_tok), n + _F_EPS)
            out[f"{p}_ratio_fraction_low"] = _over(Fraction(self.lo_tok), n + _F_EPS)
            out[f"{p}_max"] = self.w.hi
            out[f"{p}_min"] = self.w.lo
        out[f"{p}_std"] = _std_eps(self.w, n)
        out[f"{p}_eff_sample_size"] = _ess(self.w, n)
        out[f"{p}_seq_mean"] = _over(self.seq.sum.exact(), Fraction(rows))
        out[f"{p}_seq_std"] = _std_unbiased(self.seq)
        out[f"{p}_seq_max"] = self.seq.hi
        out[f"{p}_seq_min"] = self.seq.lo
        out[f"{p}_seq_max_deviation"] = self.seq_dev
        out[f"{p}_seq_fraction_high"] = self.seq_hi / rows
        out[f"{p}_seq_fraction_low"] = self.seq_lo / rows
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
        self.thr_hi = self.upper_log if self.k1 else upper      # metrics_upper_threshold
        self.thr_lo = self.lower_log if self.k1 else 0.0        # metrics_lower_threshold
        self.stat = _Stats()       # the statistic per token (a row's value on each of its tokens)
        self.clamped = _Stats()    # clamped to [clamp_min, thr_hi], per token (std)
        self.tok_hi = 0            # token level: stat > thr_hi
        self.tok_lo = 0
        self.rejected = 0          # tokens rejected
        self.seq = _Stats()        # per valid row: its statistic (or mean token statistic)
        self.seq_dev = 0.0         # max |row value|
        self.seq_hi = 0
        self.seq_lo = 0
        self.seq_rejected = 0      # valid rows with a rejected token

    def keep(self, stat: np.ndarray | float):
        if self.k1:
            return (stat >= self.lower_log) & (stat <= self.upper_log)
        return stat <= self.upper

    def clamp(self, stat):
        return np.clip(stat, self.thr_lo if self.k1 else 0.0, self.thr_hi)

    def merge(self, o: "_RS") -> None:
        for name in ("stat", "clamped", "seq"):
            getattr(self, name).merge(getattr(o, name))
        for name in ("tok_hi", "tok_lo", "rejected", "seq_hi", "seq_lo", "seq_rejected"):
            setattr(self, name, getattr(self, name) + getattr(o, name))
        self.seq_dev = max(self.seq_dev, o.seq_dev)

    def report(self, n: int, valid: int) -> dict:
        p = f"rollout_corr/rollout_rs_{self.option}"
        out = {f"{p}_mean": _masked_mean(self.stat.sum, n)}
        if self.level == "sequence" and valid:
            out[f"{p}_max"], out[f"{p}_min"] = self.seq.hi, self.seq.lo
            out[f"{p}_fraction_high"] = self.seq_hi / valid
            out[f"{p}_fraction_low"] = self.seq_lo / valid if self.k1 else 0.0
        else:
            out[f"{p}_max"], out[f"{p}_min"] = self.stat.hi, self.stat.lo
            out[f"{p}_fraction_high"] = _over(Fraction(self.tok_hi), n + _F_EPS)
            out[f"{p}_fraction_low"] = _over(Fraction(self.tok_lo), n + _F_EPS) if self.k1 \
                else 0.0
        out[f"{p}_std"] = _std_eps(self.clamped, n)
        if valid:
            out[f"{p}_seq_mean"] = _over(self.seq.sum.exact(), Fraction(valid))
            out[f"{p}_seq_std"] = _std_unbiased(self.seq)
            out[f"{p}_seq_max"], out[f"{p}_seq_min"] = self.seq.hi, self.seq.lo
            out[f"{p}_seq_max_deviation"] = self.seq_dev
            out[f"{p}_seq_fraction_high"] = self.seq_hi / valid
            if self.k1:
                out[f"{p}_seq_fraction_low"] = self.seq_lo / valid
        out[f"{p}_masked_fraction"] = _over(Fraction(self.rejected), n + _F_EPS)
        out[f"{p}_seq_masked_fraction"] = self.seq_rejected / valid if valid else 0.0
        return out


def _token_stat(option: str, cd: np.ndarray) -> np.ndarray:
    """verl's token_k1 / k2 / k3 of the clamped log ratio."""
    k = option[-2:]
    if k == "k1":
        return -cd
    if k == "k2":
        return 0.5 * cd ** 2
    return np.exp(cd) - 1.0 - cd


class FrameworkAccumulator:
    """The verl and NeMo-RL metrics of the audited tokens, updated chunk by chunk and
    merged exactly (see the module docstring)."""

    def __init__(self, options: FrameworkOptions | None = None) -> None:
        self.options = options or FrameworkOptions()
        self.n = 0                # audited tokens
        self.rows = 0             # valid sequences (B)
        self.valid = 0            # valid sequences with an audited token
        t = self.options.rollout_is_threshold
        self.is_token, self.is_seq = _IS(), _IS()
        self.rs = [_RS(o, lo, up) for o, lo, up in self.options.rs]
        self.rs_rejected = 0      # tokens rejected by some option
        self.rs_rows = 0          # rows with a rejected token
        self.d = _Sum()           # sum d (kl = -mean d)
        self.k3 = _Sum()          # exp(d) - 1 - d  (verl k3_kl, NeMo-RL gen_kl_error)
        self.k3_rev = _Sum()      # exp(-d) - 1 + d (NeMo-RL policy_kl_error)
        self.mult = _Sum()        # exp(|d|) - 1    (NeMo-RL token_mult_prob_error - 1)
        self.js = _Sum()          # NeMo-RL js_divergence_error
        self.rho2 = _Sum()        # exp(clamp d)^2 - 1 (chi2_token)
        self.ppl = {k: _Sum() for k in ("training_ppl", "training_log_ppl", "rollout_ppl",
                                       "rollout_log_ppl", "log_ppl_diff", "log_ppl_abs_diff",
                                       "ppl_ratio", "chi2_seq")}
        self.diff_hi, self.diff_lo = -math.inf, math.inf
        self._thr = t

    # -------------------------------------------------------------- updating

    def update(self, ntok: np.ndarray, e: np.ndarray, t: np.ndarray, d: np.ndarray,
               nzi: np.ndarray) -> None:
        """One chunk: ``ntok`` [S] audited tokens per valid sequence, ``e`` / ``t`` [n]
        the audited logprobs (compare dtype), ``d`` [n] float64 ``t - e``, ``nzi`` the
        indices where d != 0."""
        nseq = int(ntok.size)
        n = int(d.size)
        self.rows += nseq
        self.n += n
        self.valid += int(np.count_nonzero(ntok))
        if nseq == 0:
            return
        has = ntok > 0
        starts = np.zeros(nseq, dtype=np.int64)
        np.cumsum(ntok[:-1], out=starts[1:])
        sum_t = np.zeros(nseq)
        sum_e = np.zeros(nseq)
        if n:
            sum_t[has] = np.add.reduceat(t, starts[has], dtype=np.float64)
            sum_e[has] = np.add.reduceat(e, starts[has], dtype=np.float64)
        dn = d[nzi]
        seq_nz = np.repeat(np.arange(nseq, dtype=np.int64), ntok)[nzi]
        nz_per_seq = np.bincount(seq_nz, minlength=nseq)
        zeros = ntok - nz_per_seq
        z = int(n - dn.size)
        seq_d = np.bincount(seq_nz, weights=dn, minlength=nseq)  # S_s (token order)
        with np.errstate(over="ignore", invalid="ignore"):
            self._update_token_level(dn, e[nzi].astype(np.float64), t[nzi].astype(np.float64), z)
            self._update_is(dn, seq_nz, seq_d, ntok, zeros, z, nseq)
            self._update_rs(dn, seq_nz, seq_d, ntok, zeros, z, nseq)
            self._update_offpolicy(sum_t, sum_e, seq_d, ntok)

    def _update_token_level(self, dn: np.ndarray, en: np.ndarray, tn: np.ndarray, z: int) -> None:
        self.d.add(dn)
        self.k3.add(np.exp(dn) - 1.0 - dn)
        self.k3_rev.add(np.exp(-dn) - 1.0 + dn)
        self.mult.add(np.expm1(np.abs(dn)))
        lm = np.log(0.5 * np.exp(tn) + 0.5 * np.exp(en))
        js = 0.5 * (np.exp(tn - lm) - (tn - lm) - 1) + 0.5 * (np.exp(en - lm) - (en - lm) - 1)
        self.js.add(np.where(np.isfinite(js), js, np.inf))
        rho = np.exp(np.clip(dn, -SAFETY_BOUND, SAFETY_BOUND))
        self.rho2.add(rho * rho - 1.0)

    def _update_is(self, dn, seq_nz, seq_d, ntok, zeros, z, nseq) -> None:
        thr = self._thr
        w1 = min(1.0, thr)  # the truncated weight of a token with d == 0
        # token level: w = min(exp(clamp(d)), T)
        raw = np.exp(np.clip(dn, -SAFETY_BOUND, SAFETY_BOUND))
        w = np.minimum(raw, thr)
        it = self.is_token
        it.w.add(w, w1, z)
        it.hi_tok += int(np.count_nonzero(raw > thr)) + (z if 1.0 > thr else 0)
        it.lo_tok += int(np.count_nonzero(raw < 1.0 / thr)) + (z if 1.0 < 1.0 / thr else 0)
        seq_w = np.bincount(seq_nz, weights=w, minlength=nseq) + zeros * w1
        seq_raw = np.bincount(seq_nz, weights=raw, minlength=nseq) + zeros * 1.0
        it.add_rows(seq_w / (ntok + EPS), seq_raw / (ntok + EPS), thr)
        # sequence level: one weight exp(clamp(S_s)) per row, on each of its tokens
        iq = self.is_seq
        raw_s = np.exp(np.clip(seq_d, -SAFETY_BOUND, SAFETY_BOUND))
        w_s = np.minimum(raw_s, thr)
        iq.w.add(w_s, weights=ntok)
        iq.seq_log_hi = max(iq.seq_log_hi, float(seq_d.max()) + 0.0)
        iq.seq_log_lo = min(iq.seq_log_lo, float(seq_d.min()) + 0.0)
        iq.hi_seq += int(np.count_nonzero(seq_d > math.log(thr)))
        iq.lo_seq += int(np.count_nonzero(seq_d < math.log(1.0 / thr)))
        iq.add_rows(ntok * w_s / (ntok + EPS), ntok * raw_s / (ntok + EPS), thr)

    def _update_rs(self, dn, seq_nz, seq_d, ntok, zeros, z, nseq) -> None:
        if not self.rs:
            return
        cd = np.clip(dn, -SAFETY_BOUND, SAFETY_BOUND)
        has = ntok > 0
        rejected_tok = np.zeros(dn.size, dtype=bool)   # nonzero tokens rejected by some option
        rejected_zero = False                          # tokens with d == 0 rejected (token options)
        rejected_seq = np.zeros(nseq, dtype=bool)      # rows rejected whole (sequence options)
        for r in self.rs:
            stat = _token_stat(r.option, cd)
            if r.level == "token":
                keep = r.keep(stat)
                keep0 = bool(r.keep(0.0))
                r.stat.add(stat, 0.0, z)
                r.clamped.add(r.clamp(stat), float(r.clamp(0.0)), z)
                r.tok_hi += int(np.count_nonzero(stat > r.thr_hi)) + (z if 0.0 > r.thr_hi else 0)
                r.tok_lo += int(np.count_nonzero(stat < r.thr_lo)) + (z if 0.0 < r.thr_lo else 0)
                rej = np.bincount(seq_nz, weights=~keep, minlength=nseq) + (0 if keep0 else zeros)
                r.rejected += int(rej.sum())
                seq_val = (np.bincount(seq_nz, weights=stat, minlength=nseq)) / (ntok + EPS)
                rejected_tok |= ~keep
                rejected_zero |= not keep0
            else:
                per = np.bincount(seq_nz, weights=stat, minlength=nseq)
                if r.option.startswith("seq_mean"):
                    per = per / (ntok + EPS)
                elif r.option.startswith("seq_max"):
                    top = np.where(zeros > 0, 0.0, -np.inf)
                    np.maximum.at(top, seq_nz, stat)
                    per = np.where(np.isneginf(top), 0.0, top)
                keep_s = r.keep(per)
                r.stat.add(per, weights=ntok)
                r.clamped.add(r.clamp(per), weights=ntok)
                rej = np.where(keep_s, 0, ntok)
                r.rejected += int(rej.sum())
                seq_val = per
                rejected_seq |= ~keep_s & has
            v = seq_val[has]
            r.seq.add(v)
            if v.size:
                r.seq_dev = max(r.seq_dev, float(np.abs(v).max()))
            r.seq_hi += int(np.count_nonzero(v > r.thr_hi))
            r.seq_lo += int(np.count_nonzero(v < r.thr_lo)) if r.k1 else 0
            r.seq_rejected += int(np.count_nonzero(rej[has] > 0))
        per_row = np.bincount(seq_nz, weights=rejected_tok, minlength=nseq) + \
            (zeros if rejected_zero else 0)
        per_row = np.where(rejected_seq, ntok, per_row)
        self.rs_rejected += int(per_row.sum())
        self.rs_rows += int(np.count_nonzero(per_row > 0))

    def _update_offpolicy(self, sum_t, sum_e, seq_d, ntok) -> None:
        mt = sum_t / (ntok + EPS)
        me = sum_e / (ntok + EPS)
        diff = me - mt
        for key, x in (("training_ppl", np.exp(-mt)), ("training_log_ppl", -mt),
                       ("rollout_ppl", np.exp(-me)), ("rollout_log_ppl", -me),
                       ("log_ppl_diff", diff), ("log_ppl_abs_diff", np.abs(diff)),
                       ("ppl_ratio", np.exp(diff)),
                       ("chi2_seq", np.exp(2.0 * np.clip(seq_d, -SAFETY_BOUND, SAFETY_BOUND)))):
            self.ppl[key].add(x)
        if diff.size:
            self.diff_hi = max(self.diff_hi, float(diff.max()) + 0.0)
            self.diff_lo = min(self.diff_lo, float(diff.min()) + 0.0)

    def merge(self, o: "FrameworkAccumulator") -> None:
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
        for name in ("d", "k3", "k3_rev", "mult", "js", "rho2"):
            getattr(self, name).merge(getattr(o, name))
        for k, v in o.ppl.items():
            self.ppl[k].merge(v)
        self.diff_hi, self.diff_lo = max(self.diff_hi, o.diff_hi), min(self.diff_lo, o.diff_lo)

    # -------------------------------------------------------------- the report

    def report(self) -> dict:
        """{"verl": {...}, "nemo_rl": {...}}: each framework's metrics under its own names
        (None where nothing was audited)."""
        n, rows = self.n, self.rows
        opts = self.options
        config = {"rollout_is_threshold": opts.rollout_is_threshold,
                  "rollout_rs": opts.rollout_rs, "rollout_rs_threshold": str(opts.rollout_rs_threshold)}
        if n == 0:
            return {"verl": {"source": VERL_SOURCE, "config": config, "rollout_is_token": None,
                             "rollout_is_sequence": None, "rollout_rs": None, "offpolicy": None},
                    "nemo_rl": {"source": NEMO_SOURCE, "token_mult_prob_error": None,
                                "gen_kl_error": None, "policy_kl_error": None,
                                "js_divergence_error": None}}
        denom = n + _F_EPS
        rs = None
        if self.rs:
            rs = {}
            for r in self.rs:
                rs.update(r.report(n, self.valid))
            rs["rollout_corr/rollout_rs_masked_fraction"] = _over(Fraction(self.rs_rejected), denom)
            rs["rollout_corr/rollout_rs_seq_masked_fraction"] = self.rs_rows / rows
        fr = Fraction(rows)
        d = self.d.exact()
        k3 = self.k3.exact()
        rho2 = self.rho2.exact()
        off = {
            "rollout_corr/training_ppl": _over(self.ppl["training_ppl"].exact(), fr),
            "rollout_corr/training_log_ppl": _over(self.ppl["training_log_ppl"].exact(), fr),
            "rollout_corr/kl": _over(-d, denom),  # type: ignore[operator]
            "rollout_corr/k3_kl": _over(k3, denom),
            "rollout_corr/rollout_ppl": _over(self.ppl["rollout_ppl"].exact(), fr),
            "rollout_corr/rollout_log_ppl": _over(self.ppl["rollout_log_ppl"].exact(), fr),
            "rollout_corr/log_ppl_diff": _over(self.ppl["log_ppl_diff"].exact(), fr),
            "rollout_corr/log_ppl_abs_diff": _over(self.ppl["log_ppl_abs_diff"].exact(), fr),
            "rollout_corr/log_ppl_diff_max": self.diff_hi,
            "rollout_corr/log_ppl_diff_min": self.diff_lo,
            "rollout_corr/ppl_ratio": _over(self.ppl["ppl_ratio"].exact(), fr),
            "rollout_corr/chi2_token": None if rho2 is None else
            fraction_to_float((n + rho2) / denom - 1),
            "rollout_corr/chi2_seq": None if self.ppl["chi2_seq"].exact() is None else
            fraction_to_float(self.ppl["chi2_seq"].exact() / fr - 1),  # type: ignore[operator]
        }
        for key in ("rollout_corr/chi2_token", "rollout_corr/chi2_seq"):
            if off[key] is None:
                off[key] = math.inf
        mult = self.mult.exact()
        return {
            "verl": {"source": VERL_SOURCE, "config": config,
                     "rollout_is_token": self.is_token.report("token", n, rows),
                     "rollout_is_sequence": self.is_seq.report("sequence", n, rows),
                     "rollout_rs": rs, "offpolicy": off},
            "nemo_rl": {
                "source": NEMO_SOURCE,
                "token_mult_prob_error": math.inf if mult is None else
                fraction_to_float((n + mult) / denom),
                "gen_kl_error": _over(k3, denom),
                "policy_kl_error": _over(self.k3_rev.exact(), denom),
                "js_divergence_error": _over(self.js.exact(), denom),
            },
        }
