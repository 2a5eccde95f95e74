"""Audit metrics as exact, mergeable accumulators (see docs/audit.md for every formula).

Token level, over the mask: ``d = trainer - engine`` (float64), ``r = exp(d)``.
:class:`AuditAccumulator` consumes validated :class:`~detsample.audit.inputs.table.AuditBatch`
chunks with whole-column numpy operations and merges with other accumulators *exactly*:

* counts are integers;
* sums are exact (:func:`detsample.audit.analysis.exact.exact_sums`, integers scaled by 2**1074),
  so the chunking and the merge order cannot change a bit of the result;
* per-sequence quantities use only that sequence's tokens, in token order;
* |d| quantiles come from an exact multiset of the non-zero |d| values
  (:class:`~detsample.audit.analysis.exact.ValueCounts`) plus a count of zeros;
* max/min are order-independent; kept issue lists and the worst-sequence table are sorted
  by location before truncation.

So one process reading the file in one pass and N processes reading shards give the same
report, byte for byte.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from detsample.audit.analysis.diagnose import diagnose
from detsample.audit.analysis.exact import (
    ValueCounts,
    exact_marginal_sums,
    exact_mean,
    exact_sums,
    fraction_to_float,
    to_fraction,
)
from detsample.audit.analysis.frameworks import FrameworkAccumulator, FrameworkOptions
from detsample.audit.analysis.rows import RowTables
from detsample.audit.inputs.table import AuditBatch
from detsample.audit.issues import Issue

#: |d| > t mismatch thresholds, and their JSON keys
THRESHOLDS = (0.0, 1e-6, 1e-3, 1e-2, 0.1)
THRESHOLD_KEYS = tuple(f"{t:g}" for t in THRESHOLDS)
QUANTILES = (0.5, 0.9, 0.99, 0.999)
QUANTILE_KEYS = ("p50", "p90", "p99", "p99.9")
#: quantiles of the importance ratio r = exp(d) (both tails), and their JSON keys
RATIO_QUANTILES = (0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999)
RATIO_QUANTILE_KEYS = ("p0.1", "p1", "p10", "p50", "p90", "p99", "p99.9")
#: engine-probability bucket edges: bucket k holds p in [edge_k, edge_k+1), the last closed
PROB_EDGES = (0.0, 1e-6, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 0.9, 0.99, 1.0)
_LOG_INNER_EDGES = np.log(np.asarray(PROB_EDGES[1:-1]))
#: response-position buckets: 0, 1, [2, 4), [4, 8), ..., [2**30, inf)
NUM_POSITION_BUCKETS = 32
#: |d| histogram edges (decades) for the report's plot; zeros are counted apart
HIST_EDGES = 10.0 ** np.arange(-16, 3, dtype=np.float64)
MAX_ISSUES = 100
#: dtypes both logprob columns may be rounded to before comparing (None: promote)
COMPARE_DTYPES = (None, "float16", "float32", "float64")
MAX_WORST = 10


def position_bucket_labels() -> list[str]:
    labels = ["0", "1"]
    for b in range(2, NUM_POSITION_BUCKETS):
        lo = 1 << (b - 1)
        labels.append(f"[{lo}, {2 * lo})" if b < NUM_POSITION_BUCKETS - 1 else f">= {lo}")
    return labels


def prob_bucket_labels() -> list[str]:
    e = PROB_EDGES
    return [f"[{e[k]:g}, {e[k + 1]:g}{']' if k == len(e) - 2 else ')'}" for k in range(len(e) - 1)]


def position_buckets(pos: np.ndarray) -> np.ndarray:
    """Bucket of each response position: 0 -> 0, p >= 1 -> floor(log2 p) + 1 (capped)."""
    _, exp = np.frexp(pos.astype(np.float64))
    return np.minimum(exp, NUM_POSITION_BUCKETS - 1).astype(np.int64)


def _position_bucket_table(longest: int) -> np.ndarray:
    """position_buckets(arange(longest)) as int8, for a gather instead of a frexp."""
    return position_buckets(np.arange(max(longest, 1), dtype=np.int64)).astype(np.int8)


def prob_buckets(engine_lp: np.ndarray) -> np.ndarray:
    """Bucket of each engine probability exp(lp), compared in log space: the number of
    inner edges log(edge) <= lp (one vectorised compare per edge)."""
    out = np.zeros(engine_lp.shape, dtype=np.int8)
    for edge in _LOG_INNER_EDGES:
        out += engine_lp >= edge
    return out


def _sum_with_inf(x: np.ndarray) -> tuple[int, int]:
    """(exact sum of the finite values, count of +inf); x has no NaN and no -inf."""
    fin = np.isfinite(x)
    if fin.all():
        return exact_sums(x, check=False)[0], 0
    return exact_sums(x[fin], check=False)[0], int((~fin).sum())


def _uint_view(a: np.ndarray) -> np.ndarray:
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


class _Groups:
    """Per-bucket token statistics (exactly mergeable)."""

    def __init__(self, n: int) -> None:
        self.tokens = np.zeros(n, dtype=np.int64)
        self.exact = np.zeros(n, dtype=np.int64)
        self.mismatch = np.zeros(n, dtype=np.int64)
        self.sum_abs = [0] * n
        self.sum_d = [0] * n
        self.max_abs = np.zeros(n, dtype=np.float64)

    def add_counts(self, c: np.ndarray) -> None:
        """Token counts per (bucket, d != 0, exact match): c is int [n, 2, 2]."""
        self.tokens += c.sum(axis=(1, 2))
        self.exact += c[:, :, 1].sum(axis=1)
        self.mismatch += c[:, 1, :].sum(axis=1)

    def add_sums(self, sums: list[int], gn: np.ndarray, absn: np.ndarray) -> None:
        """Exact sums per (bucket, sign of d) -> sum |d| and sum d; max |d| per bucket."""
        for k in range(self.tokens.size):
            p, q = sums[2 * k], sums[2 * k + 1]
            self.sum_abs[k] += p + q
            self.sum_d[k] += p - q
        np.maximum.at(self.max_abs, gn, absn)

    def merge(self, o: _Groups) -> None:
        self.tokens += o.tokens
        self.exact += o.exact
        self.mismatch += o.mismatch
        self.sum_abs = [a + b for a, b in zip(self.sum_abs, o.sum_abs)]
        self.sum_d = [a + b for a, b in zip(self.sum_d, o.sum_d)]
        np.maximum(self.max_abs, o.max_abs, out=self.max_abs)

    def rows(self, labels: list[str]) -> list[dict]:
        out = []
        for k, label in enumerate(labels):
            n = int(self.tokens[k])
            if n == 0:
                continue
            out.append(
                {
                    "bucket": label,
                    "tokens": n,
                    "exact_match_fraction": int(self.exact[k]) / n,
                    "mismatch_fraction": int(self.mismatch[k]) / n,
                    "mean_abs_diff": exact_mean(self.sum_abs[k], n),
                    "mean_diff": exact_mean(self.sum_d[k], n),
                    "max_abs_diff": float(self.max_abs[k]),
                }
            )
        return out


class AuditAccumulator:
    """Every audit statistic, updated chunk by chunk and merged exactly across shards."""

    def __init__(self, compare_dtype: str | None = None, frameworks: FrameworkOptions | None = None) -> None:
        if compare_dtype not in COMPARE_DTYPES:
            raise ValueError(f"compare_dtype must be one of {COMPARE_DTYPES}, got {compare_dtype!r}")
        self.compare_dtype = compare_dtype
        self.frameworks = FrameworkAccumulator(frameworks)  # verl / NeMo-RL metrics
        self.sources: list[str] = []
        self.sequences_seen = 0
        self.sequences = 0
        self.excluded_by_kind: dict[str, int] = {}
        self.issues: list[Issue] = []
        self.response_tokens = 0
        self.tokens = 0
        self.exact = 0
        self.mismatch = [0] * len(THRESHOLDS)
        self.s_d2, self.inf_d2 = 0, 0
        self.s_u, self.inf_u = 0, 0  # u = r - 1 = expm1(d): no cancellation near r = 1
        self.s_u2, self.inf_u2 = 0, 0
        self.zero_d = 0
        self.max_abs = 0.0
        self.min_d = math.inf
        self.max_d = -math.inf
        self.min_r = math.inf
        self.max_r = -math.inf
        self.diff_values = ValueCounts()  # the non-zero d (signed)
        self.by_prob = _Groups(len(PROB_EDGES) - 1)
        self.by_pos = _Groups(NUM_POSITION_BUCKETS)
        self.seq_with_tokens = 0
        self.seq_mismatch = 0
        self.s_seq_sum, self.s_seq_abs = 0, 0
        self.max_seq_abs = 0.0
        self.s_lppl, self.s_lppl_abs = 0, 0
        self.max_lppl_abs = 0.0
        self.first_div: dict[int, int] = {}
        self.first_div_buckets = np.zeros(NUM_POSITION_BUCKETS, dtype=np.int64)
        self.worst: list[tuple] = []
        self.rows = RowTables(self.compare_dtype)

    # ------------------------------------------------------------------ updating

    def add_source(self, source: str) -> None:
        if source not in self.sources:
            self.sources.append(source)

    def add_issues(self, issues: list[Issue]) -> None:
        self.sequences_seen += len(issues)
        for it in issues:
            self.excluded_by_kind[it.kind] = self.excluded_by_kind.get(it.kind, 0) + 1
        if len(self.issues) < MAX_ISSUES:
            self.issues.extend(issues[: MAX_ISSUES - len(self.issues)])

    def update(self, b: AuditBatch) -> None:
        """Add the valid sequences of one chunk."""
        self.rows.update(b)
        nseq = len(b)
        self.sequences_seen += nseq
        self.sequences += nseq
        if nseq == 0:
            return
        lens = np.diff(b.offsets)
        e, t, pos, ntok = self._audited(b, lens)
        n = e.size
        self.tokens += n
        if self.compare_dtype is not None:  # both rounded to one dtype (validated finite)
            e, t = e.astype(self.compare_dtype), t.astype(self.compare_dtype)
        common = np.result_type(e.dtype, t.dtype)
        exact = _uint_view(e.astype(common, copy=False)) == _uint_view(t.astype(common, copy=False))
        self.exact += int(np.count_nonzero(exact))
        e64 = e.astype(np.float64, copy=False)
        d = t.astype(np.float64)
        d -= e64
        nz = d != 0
        gp = prob_buckets(e64)
        gq = _position_bucket_table(int(lens.max()))[pos]
        self._count_buckets(gp, gq, nz, exact)
        nzi = np.flatnonzero(nz)
        dn = d[nzi]
        starts = np.zeros(nseq, dtype=np.int64)
        np.cumsum(ntok[:-1], out=starts[1:])
        seq_nz = np.searchsorted(starts, nzi, side="right") - 1  # the row of each d != 0
        # per-sequence float64 sum of d, sequential in token order (zeros skipped: adding
        # +-0 never changes a running sum that starts at +0)
        seq_d = np.bincount(seq_nz, weights=dn, minlength=nseq)
        self.frameworks.update(ntok, e64, t, dn, seq_nz, seq_d)
        self.zero_d += n - nzi.size
        self.mismatch[0] += nzi.size
        if n > nzi.size:  # d == 0 exactly: r = 1
            self.min_d, self.max_d = min(self.min_d, 0.0), max(self.max_d, 0.0)
            self.min_r, self.max_r = min(self.min_r, 1.0), max(self.max_r, 1.0)
        if nzi.size == 0:
            self.seq_with_tokens += int(np.count_nonzero(ntok))
            return
        absn = np.abs(dn)
        self._update_buckets(dn, absn, gp[nzi], gq[nzi])
        self._update_tokens(dn, absn)
        self._update_sequences(b, ntok, seq_nz, pos[nzi], seq_d, absn)

    def _audited(self, b: AuditBatch, lens: np.ndarray) -> tuple:
        """(engine, trainer, response position) of the audited tokens (mask 1) of a
        chunk, and the audited tokens per sequence; counts its response tokens."""
        total = int(b.offsets[-1])
        self.response_tokens += total
        m = b.mask
        pos = np.arange(total, dtype=np.int64)
        pos -= np.repeat(b.offsets[:-1], lens)
        if m.all():
            return b.engine, b.trainer, pos, lens
        ntok = np.zeros(len(b), dtype=np.int64)  # audited tokens per sequence
        full = lens > 0  # non-empty sequences: strictly increasing starts < total
        if total:
            ntok[full] = np.add.reduceat(m, b.offsets[:-1][full], dtype=np.int64)
        return b.engine[m], b.trainer[m], pos[m], ntok

    def _count_buckets(self, gp: np.ndarray, gq: np.ndarray, nz: np.ndarray, exact: np.ndarray) -> None:
        """Token, mismatch and exact counts per probability and position bucket, by one
        joint ``bincount`` marginalised."""
        npb, nqb = self.by_prob.tokens.size, self.by_pos.tokens.size
        code = gp.astype(np.int16) * (nqb * 4)  # (probability, position, d != 0, exact)
        code += gq * 4
        code += nz * 2
        code += exact
        c = np.bincount(code, minlength=npb * nqb * 4).reshape(npb, nqb, 2, 2)
        self.by_prob.add_counts(c.sum(axis=1))
        self.by_pos.add_counts(c.sum(axis=0))

    def _update_buckets(self, dn: np.ndarray, absn: np.ndarray, gpn: np.ndarray, gqn: np.ndarray) -> None:
        """Exact sums of |d| and d per bucket, over the non-zero d (one joint binning)."""
        npb, nqb = self.by_prob.tokens.size, self.by_pos.tokens.size
        joint = gpn.astype(np.int64) * (2 * nqb)  # (probability, position, sign of d)
        joint += gqn * 2
        joint += dn < 0
        sp, sq = exact_marginal_sums(absn, joint, (npb, nqb, 2), check=False)
        self.by_prob.add_sums(sp, gpn, absn)
        self.by_pos.add_sums(sq, gqn, absn)

    def _update_tokens(self, dn: np.ndarray, absn: np.ndarray) -> None:
        """The token-level statistics of the non-zero d: thresholds, exact sums of d^2,
        u = r - 1 and u^2 (infinities counted apart), extremes, the exact multiset."""
        for k, thr in enumerate(THRESHOLDS[1:], start=1):
            self.mismatch[k] += int(np.count_nonzero(absn > thr))
        max_abs, min_d, max_d = float(absn.max()), float(dn.min()), float(dn.max())
        with np.errstate(over="ignore"):
            u = np.expm1(dn)  # u = r - 1: no cancellation near r = 1
            u2 = u * u
            d2 = dn * dn
            r_ext = np.exp(np.array([min_d, max_d]))
        if max_abs <= 300.0:  # nothing overflows (d^2, u^2 < 1e261): skip the inf checks
            sums = [(exact_sums(x, check=False)[0], 0) for x in (d2, u, u2)]
        else:  # |d| > 1.3e154 overflows d^2; d > 709 overflows r
            sums = [_sum_with_inf(x) for x in (d2, u, u2)]
        for name, (sm, inf) in zip(("d2", "u", "u2"), sums):
            setattr(self, f"s_{name}", getattr(self, f"s_{name}") + sm)
            setattr(self, f"inf_{name}", getattr(self, f"inf_{name}") + inf)
        self.max_abs = max(self.max_abs, max_abs)
        self.min_d = min(self.min_d, min_d)
        self.max_d = max(self.max_d, max_d)
        self.min_r = min(self.min_r, float(r_ext[0]))  # exp is monotone: min r = exp(min d)
        self.max_r = max(self.max_r, float(r_ext[1]))
        self.diff_values.add(dn, check=False)  # d != 0 here: no NaN, no -0.0

    def _update_sequences(
        self,
        b: AuditBatch,
        ntok: np.ndarray,
        seq_nz: np.ndarray,
        pos_nz: np.ndarray,
        full_sum: np.ndarray,
        absn: np.ndarray,
    ) -> None:
        has = ntok > 0
        self.seq_with_tokens += int(has.sum())
        seq_sum = full_sum[has]
        lppl = -seq_sum / ntok[has]
        self.s_seq_sum += exact_sums(seq_sum)[0]
        self.s_seq_abs += exact_sums(np.abs(seq_sum))[0]
        self.max_seq_abs = max(self.max_seq_abs, float(np.abs(seq_sum).max()))
        self.s_lppl += exact_sums(lppl)[0]
        self.s_lppl_abs += exact_sums(np.abs(lppl))[0]
        self.max_lppl_abs = max(self.max_lppl_abs, float(np.abs(lppl).max()))
        starts = np.flatnonzero(np.r_[True, seq_nz[1:] != seq_nz[:-1]])
        div_seq = seq_nz[starts]
        self.seq_mismatch += div_seq.size
        first = pos_nz[starts]
        fp, fc = np.unique(first, return_counts=True)
        for p, c in zip(fp.tolist(), fc.tolist()):
            self.first_div[p] = self.first_div.get(p, 0) + c
        self.first_div_buckets += np.bincount(position_buckets(first), minlength=NUM_POSITION_BUCKETS)
        seq_max = np.maximum.reduceat(absn, starts)
        top = np.lexsort((b.lines[div_seq], -seq_max))[:MAX_WORST]
        cand = [
            (
                -float(seq_max[k]),
                b.source,
                int(b.lines[div_seq[k]]),
                b.unit,
                b.ids[div_seq[k]],
                float(full_sum[div_seq[k]]),
                int(first[k]),
            )
            for k in top.tolist()
        ]
        self.worst = sorted(self.worst + cand)[:MAX_WORST]

    def merge(self, o: AuditAccumulator) -> None:
        """Add another accumulator (the shard that comes after this one in file order)."""
        if o.compare_dtype != self.compare_dtype:
            raise ValueError(f"cannot merge audits compared as {o.compare_dtype} and {self.compare_dtype}")
        for s in o.sources:
            self.add_source(s)
        self.sequences_seen += o.sequences_seen
        self.sequences += o.sequences
        for k, v in o.excluded_by_kind.items():
            self.excluded_by_kind[k] = self.excluded_by_kind.get(k, 0) + v
        self.issues = (self.issues + o.issues)[:MAX_ISSUES]
        for name in (
            "response_tokens",
            "tokens",
            "exact",
            "s_d2",
            "inf_d2",
            "s_u",
            "inf_u",
            "s_u2",
            "inf_u2",
            "zero_d",
            "seq_with_tokens",
            "seq_mismatch",
            "s_seq_sum",
            "s_seq_abs",
            "s_lppl",
            "s_lppl_abs",
        ):
            setattr(self, name, getattr(self, name) + getattr(o, name))
        self.mismatch = [a + b for a, b in zip(self.mismatch, o.mismatch)]
        for name in ("max_abs", "max_d", "max_r", "max_seq_abs", "max_lppl_abs"):
            setattr(self, name, max(getattr(self, name), getattr(o, name)))
        for name in ("min_d", "min_r"):
            setattr(self, name, min(getattr(self, name), getattr(o, name)))
        self.diff_values.merge(o.diff_values)
        self.by_prob.merge(o.by_prob)
        self.by_pos.merge(o.by_pos)
        for p, c in o.first_div.items():
            self.first_div[p] = self.first_div.get(p, 0) + c
        self.first_div_buckets += o.first_div_buckets
        self.worst = sorted(self.worst + o.worst)[:MAX_WORST]
        self.rows.merge(o.rows)
        self.frameworks.merge(o.frameworks)

    # ------------------------------------------------------------------ the report

    def report(self) -> dict:
        """The JSON-ready report (see docs/audit.md for every key)."""
        pos_labels = position_bucket_labels()
        rep = {
            "sources": list(self.sources),
            "compare_dtype": self.compare_dtype or "promoted",
            "sequences": self.sequences,
            "sequences_seen": self.sequences_seen,
            "excluded_sequences": self.sequences_seen - self.sequences,
            "excluded_by_kind": dict(sorted(self.excluded_by_kind.items())),
            "issues": [it.to_json() for it in self.issues],
            **self._token_report(),
            "importance_ratio": self._ratio_report(),
            "sequence": self._sequence_report(pos_labels),
            "by_probability": self.by_prob.rows(prob_bucket_labels()),
            "by_position": self.by_pos.rows(pos_labels),
            "abs_diff_histogram": self._histogram_report(),
            "worst_sequences": [
                {
                    "source": src,
                    unit: line,
                    "id": rid,
                    "max_abs_diff": -neg_max,
                    "sum_diff": sd,
                    "first_divergence": fdp,
                }
                for neg_max, src, line, unit, rid, sd, fdp in self.worst
            ],
            "frameworks": self.frameworks.report(
                self.diff_values, self.zero_d, sum(self.by_prob.sum_d), None if self.inf_u else self.s_u
            ),
            **self.rows.report(),
        }
        rep["diagnosis"] = diagnose(rep, None, [])  # the signature; a model's: audit()
        return rep

    def _token_report(self) -> dict:
        """The token-level keys: counts, exact matches, mismatch fractions, |d| and d
        statistics, the KL estimators (every mean from exact sums, rounded once)."""
        n = self.tokens
        s_abs, s_d = sum(self.by_prob.sum_abs), sum(self.by_prob.sum_d)
        frac = lambda k: k / n if n else None  # noqa: E731
        quant = self.diff_values.abs_quantiles(list(QUANTILES), zeros=self.zero_d)
        std = None
        if n:
            v = to_fraction(self.s_d2, n) - to_fraction(s_abs, n) ** 2
            std = math.inf if self.inf_d2 else math.sqrt(max(fraction_to_float(v), 0.0))
        return {
            "tokens": n,
            "response_tokens": self.response_tokens,
            "unmasked_tokens": self.response_tokens - n,
            "exact_matches": self.exact,
            "exact_match_fraction": frac(self.exact),
            "mismatch_fraction": {k: frac(c) for k, c in zip(THRESHOLD_KEYS, self.mismatch)},
            "mismatch_count": dict(zip(THRESHOLD_KEYS, self.mismatch)),
            "max_abs_diff": self.max_abs if n else None,
            "mean_abs_diff": exact_mean(s_abs, n),
            "std_abs_diff": std,
            "abs_diff_quantiles": dict(zip(QUANTILE_KEYS, quant)),
            "mean_diff": exact_mean(s_d, n),
            "min_diff": self.min_d if n else None,
            "max_diff": self.max_d if n else None,
            "k1_kl_mean": exact_mean(-s_d, n),
            "k2_kl_mean": None if not n else (math.inf if self.inf_d2 else exact_mean(self.s_d2, 2 * n)),
            # k3 = (r - 1) - d = u - d: sum u - sum d, both exact (no per-token rounding)
            "k3_kl_mean": None if not n else (math.inf if self.inf_u else exact_mean(self.s_u - s_d, n)),
        }

    def _ratio_report(self) -> dict:
        """The importance ratio r = exp(d): mean, std, extremes, ESS, chi^2, quantiles."""
        n = self.tokens
        if n and not (self.inf_u or self.inf_u2):
            # r = 1 + u: sum r = n + U1, sum r^2 = n + 2 U1 + U2 (exact rationals)
            u1, u2 = to_fraction(self.s_u), to_fraction(self.s_u2)
            sr, sr2 = n + u1, n + 2 * u1 + u2
            # sum r^2 from the rounded u^2 can reach 0 when every r is tiny (d < -18):
            # then there is no ESS to report (bug pinned by tests/audit/test_fuzz.py)
            ess_f = sr * sr / sr2 if sr2 > 0 else None
            ratio = {
                "mean": fraction_to_float(sr / n),
                "std": math.sqrt(max(fraction_to_float(u2 / n - (u1 / n) ** 2), 0.0)),
                "min": self.min_r,
                "max": self.max_r,
                "ess": None if ess_f is None else fraction_to_float(ess_f),
                "ess_fraction": None if ess_f is None else fraction_to_float(ess_f / n),
                "chi2": fraction_to_float((2 * u1 + u2) / n),
            }
        elif n:
            ratio = {
                "mean": math.inf,
                "std": math.inf,
                "min": self.min_r,
                "max": self.max_r,
                "ess": None,
                "ess_fraction": None,
                "chi2": math.inf,
            }
        else:
            ratio = {k: None for k in ("mean", "std", "min", "max", "ess", "ess_fraction", "chi2")}
        ratio["quantiles"] = dict(
            zip(
                RATIO_QUANTILE_KEYS,
                self.diff_values.quantiles(list(RATIO_QUANTILES), zeros=self.zero_d, transform=np.exp),
            )
        )
        return ratio

    def _sequence_report(self, pos_labels: list[str]) -> dict:
        """The sequence-level keys (sums of d, log-perplexity differences, first
        divergence), over the sequences with an audited token."""
        ns = self.seq_with_tokens
        fd_total = sum(self.first_div.values())
        fd = {"sequences": fd_total, "min": None, "p50": None, "mean": None, "max": None}
        if fd_total:
            keys = sorted(self.first_div)
            cum = np.cumsum([self.first_div[k] for k in keys])
            fd.update(
                min=keys[0],
                max=keys[-1],
                p50=keys[int(np.searchsorted(cum, (fd_total - 1) // 2, side="right"))],
                mean=fraction_to_float(Fraction(sum(k * c for k, c in self.first_div.items()), fd_total)),
            )
        return {
            "sequences_with_tokens": ns,
            "sequences_with_mismatch": self.seq_mismatch,
            "mismatch_fraction": self.seq_mismatch / ns if ns else None,
            "sum_diff_mean": exact_mean(self.s_seq_sum, ns),
            "sum_diff_abs_mean": exact_mean(self.s_seq_abs, ns),
            "sum_diff_abs_max": self.max_seq_abs if ns else None,
            "log_ppl_diff_mean": exact_mean(self.s_lppl, ns),
            "log_ppl_diff_abs_mean": exact_mean(self.s_lppl_abs, ns),
            "log_ppl_diff_abs_max": self.max_lppl_abs if ns else None,
            "first_divergence": fd,
            "first_divergence_by_position": {pos_labels[k]: int(c) for k, c in enumerate(self.first_div_buckets) if c},
        }

    def _histogram_report(self) -> dict:
        """Exact counts of |d| per decade, the zeros and both tails apart."""
        hist = self.diff_values.abs_histogram(np.r_[0.0, HIST_EDGES, np.inf])
        return {
            "zero": self.zero_d,
            "edges": [float(x) for x in HIST_EDGES],
            "counts": [int(c) for c in hist[1:-1]],
            "below_first_edge": int(hist[0]),
            "at_or_above_last_edge": int(hist[-1]),
        }
