"""Audit metrics against an independent, straightforward numpy computation
(detsample/auditmetrics.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detsample.audit import audit
from detsample.audit.analysis.metrics import (
    PROB_EDGES,
    RATIO_QUANTILE_KEYS,
    RATIO_QUANTILES,
    THRESHOLD_KEYS,
    THRESHOLDS,
)
from tests.audit.synth import synth_rollouts, to_records

REL = 1e-9  # float sums here are plain numpy (rounding in another order); counts are exact

ROLLOUT_CASES = [
    # (name, synth kwargs)
    ("exact", dict(mismatch_rate=0.0)),
    ("tiny-noise", dict(mismatch_rate=0.5, scales=(1e-7,))),
    ("mixed", dict(mismatch_rate=0.3)),
    ("all-mismatch-fp64", dict(mismatch_rate=1.0, scales=(1e-3, 0.5), dtype="float64")),
    ("no-mask", dict(mismatch_rate=0.2, mask_rate=1.0)),
    ("sparse-mask", dict(mismatch_rate=0.2, mask_rate=0.1)),
]


def reference(records: list[dict]) -> dict:
    """Plain per-sequence float64 numpy computation of the metrics (the oracle)."""
    ds, es, exact, positions = [], [], [], []
    seq_sums, lppl, first = [], [], []
    for r in records:
        e = np.asarray(r["engine_logprobs"], dtype=np.float64)
        t = np.asarray(r["trainer_logprobs"], dtype=np.float64)
        m = np.asarray(r.get("mask", [1] * e.size), dtype=bool)
        pos = np.arange(e.size)[m]
        e, t = e[m], t[m]
        d = t - e
        ds.append(d)
        es.append(e)
        exact.append(e.view(np.uint64) == t.view(np.uint64))
        positions.append(pos)
        if d.size:
            seq_sums.append(math.fsum(d))
            lppl.append(-d.mean())
            nzp = pos[d != 0]
            if nzp.size:
                first.append(int(nzp[0]))
    d = np.concatenate(ds)
    e = np.concatenate(es)
    a = np.abs(d)
    r = np.exp(d)
    n = d.size
    out = {
        "tokens": n,
        "exact_match_fraction": np.concatenate(exact).sum() / n,
        "mismatch_fraction": {k: float((a > t).sum() / n) for k, t in zip(THRESHOLD_KEYS, THRESHOLDS)},
        "mean_abs_diff": a.mean(),
        "std_abs_diff": a.std(),
        "max_abs_diff": a.max(),
        "abs_diff_quantiles": {
            k: float(np.quantile(a, q)) for k, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999))
        },
        "mean_diff": d.mean(),
        "k1_kl_mean": (-d).mean(),
        "k2_kl_mean": (d**2 / 2).mean(),
        "k3_kl_mean": ((r - 1) - d).mean(),
        "ratio": {
            "mean": r.mean(),
            "std": r.std(),
            "min": r.min(),
            "max": r.max(),
            "ess": r.sum() ** 2 / (r**2).sum(),
            "chi2": math.fsum(r * r) / n - 1,
            "quantiles": {k: float(np.quantile(r, q)) for k, q in zip(RATIO_QUANTILE_KEYS, RATIO_QUANTILES)},
        },
        "seq_mismatch": sum(1 for x in ds if x.size and (x != 0).any()),
        "seq_with_tokens": sum(1 for x in ds if x.size),
        "sum_diff_mean": np.mean(seq_sums),
        "sum_diff_abs_max": np.max(np.abs(seq_sums)),
        "log_ppl_diff_mean": np.mean(lppl),
        "first": first,
        "prob_tokens": np.histogram(np.exp(e), bins=PROB_EDGES)[0],
    }
    return out


def _close(a, b):
    assert a == pytest.approx(b, rel=REL, abs=1e-15)


@pytest.mark.parametrize("name,kwargs", ROLLOUT_CASES)
def test_metrics_match_reference(name, kwargs):
    """Pins every token and sequence metric against the plain oracle on known perturbations."""
    cols = synth_rollouts(150, seed=hash(name) % 1000, **kwargs)
    records = to_records(cols)
    rep = audit(records)
    ref = reference(records)
    assert rep["tokens"] == ref["tokens"]
    assert rep["exact_match_fraction"] == ref["exact_match_fraction"]
    assert rep["mismatch_fraction"] == ref["mismatch_fraction"]
    assert rep["max_abs_diff"] == ref["max_abs_diff"]
    assert rep["abs_diff_quantiles"] == ref["abs_diff_quantiles"]
    for k in ("mean_abs_diff", "std_abs_diff", "mean_diff", "k1_kl_mean", "k2_kl_mean", "k3_kl_mean"):
        _close(rep[k], ref[k])
    ir = rep["importance_ratio"]
    for k in ("mean", "std", "ess"):
        _close(ir[k], ref["ratio"][k])
    assert ir["chi2"] == pytest.approx(ref["ratio"]["chi2"], abs=1e-13)  # cancellation near 0
    assert (ir["min"], ir["max"]) == (ref["ratio"]["min"], ref["ratio"]["max"])
    assert ir["quantiles"] == ref["ratio"]["quantiles"]  # bitwise: np.quantile of exp(d)
    sq = rep["sequence"]
    assert sq["sequences_with_mismatch"] == ref["seq_mismatch"]
    assert sq["sequences_with_tokens"] == ref["seq_with_tokens"]
    _close(sq["sum_diff_mean"], ref["sum_diff_mean"])
    _close(sq["sum_diff_abs_max"], ref["sum_diff_abs_max"])
    _close(sq["log_ppl_diff_mean"], ref["log_ppl_diff_mean"])
    fd = sq["first_divergence"]
    assert fd["sequences"] == len(ref["first"])
    if ref["first"]:
        assert (fd["min"], fd["max"]) == (min(ref["first"]), max(ref["first"]))
        assert fd["p50"] == sorted(ref["first"])[(len(ref["first"]) - 1) // 2]
        _close(fd["mean"], np.mean(ref["first"]))
    by_prob = {row["bucket"]: row["tokens"] for row in rep["by_probability"]}
    assert sum(by_prob.values()) == rep["tokens"]
    assert sorted(by_prob.values()) == sorted(int(c) for c in ref["prob_tokens"] if c)


def test_exact_rollouts_audit_to_exact_match():
    """Pins the exact case: identical logprobs give 1.0 and zero everywhere."""
    rep = audit(to_records(synth_rollouts(50, seed=3, mismatch_rate=0.0)))
    assert rep["exact_match_fraction"] == 1.0
    assert rep["max_abs_diff"] == 0.0 and rep["k3_kl_mean"] == 0.0
    assert all(v == 0.0 for v in rep["mismatch_fraction"].values())
    assert rep["importance_ratio"]["ess_fraction"] == 1.0
    assert rep["sequence"]["first_divergence"]["sequences"] == 0


def test_known_constant_shift():
    """Pins d's sign and the KL formulas on a hand-computable rollout: d = +0.5 on 2 of 4."""
    recs = [
        {
            "id": "a",
            "prompt_ids": [1],
            "response_ids": [5, 6, 7, 8],
            "engine_logprobs": [-1.0, -2.0, -0.5, -3.0],
            "trainer_logprobs": [-1.0, -1.5, -0.5, -2.5],
        }
    ]
    rep = audit(recs)
    assert rep["exact_match_fraction"] == 0.5
    assert rep["mean_diff"] == 0.25 and rep["max_abs_diff"] == 0.5
    assert rep["k1_kl_mean"] == -0.25
    assert rep["k2_kl_mean"] == 0.0625
    assert rep["k3_kl_mean"] == pytest.approx((2 * (math.exp(0.5) - 1.5)) / 4, rel=1e-15)
    assert rep["sequence"]["first_divergence"]["min"] == 1
    assert rep["sequence"]["sum_diff_mean"] == 1.0
    assert rep["sequence"]["log_ppl_diff_mean"] == -0.25
    assert rep["worst_sequences"][0]["id"] == "a"


def test_exact_match_is_bitwise_after_common_dtype():
    """Pins 'bitwise': -0.0 vs 0.0 is not an exact match though d == 0; float32 engine vs
    float64 trainer holding the same float32 value is."""
    recs = [
        {
            "id": "a",
            "prompt_ids": [1],
            "response_ids": [1, 2],
            "engine_logprobs": np.array([-0.0, -0.1], dtype=np.float32),
            "trainer_logprobs": np.array([0.0, np.float32(-0.1)], dtype=np.float64),
        }
    ]
    rep = audit(recs)
    assert rep["exact_matches"] == 1
    assert rep["mismatch_fraction"]["0"] == 0.0


def test_empty_audit_reports_nulls():
    """Pins the no-token case: fractions are null, not 0 or NaN."""
    rep = audit([{"id": "a", "prompt_ids": [1], "response_ids": [], "engine_logprobs": [], "trainer_logprobs": []}])
    assert rep["sequences"] == 1 and rep["tokens"] == 0
    assert rep["exact_match_fraction"] is None and rep["max_abs_diff"] is None


def test_stratification_by_position_and_probability():
    """Pins the buckets: position 0 / 1 / [2, 4) and engine p in [0.5, 0.9) vs [0.9, 0.99)."""
    lp_hi, lp_lo = math.log(0.95), math.log(0.6)
    recs = [
        {
            "id": "a",
            "prompt_ids": [1],
            "response_ids": [1, 2, 3, 4],
            "engine_logprobs": [lp_hi, lp_lo, lp_lo, lp_hi],
            "trainer_logprobs": [lp_hi, lp_lo - 0.25, lp_lo, lp_hi - 0.125],
        }
    ]
    rep = audit(recs)
    pos = {r["bucket"]: r for r in rep["by_position"]}
    assert pos["0"]["mismatch_fraction"] == 0.0
    assert pos["1"]["mean_diff"] == -0.25
    assert pos["[2, 4)"]["tokens"] == 2 and pos["[2, 4)"]["max_abs_diff"] == 0.125
    prob = {r["bucket"]: r for r in rep["by_probability"]}
    assert prob["[0.5, 0.9)"]["tokens"] == 2 and prob["[0.5, 0.9)"]["max_abs_diff"] == 0.25
    assert prob["[0.9, 0.99)"]["mean_abs_diff"] == 0.0625


EXTREME_CASES = [
    # (engine logprob, trainer logprob): float32-min "impossible token" markers, huge d
    (-3.4028234663852886e38, -1.0),
    (-1.0, -3.4028234663852886e38),
    (-1.7976931348623157e308, -0.5),
]


@pytest.mark.parametrize("e,t", EXTREME_CASES)
def test_extreme_but_finite_logprobs_do_not_crash(e, t):
    """Pins overflow handling: r, k3 or d^2 may overflow to inf; the report says "inf"
    instead of crashing or printing NaN."""
    from detsample.audit import to_json

    rec = {
        "id": "x",
        "prompt_ids": [1],
        "response_ids": [1, 2],
        "engine_logprobs": [e, -1.0],
        "trainer_logprobs": [t, -1.0],
    }
    rep = audit([rec])
    assert rep["max_abs_diff"] == abs(t - e)
    assert rep["exact_match_fraction"] == 0.5
    assert "NaN" not in to_json(rep)


def test_compare_dtype_float32_matches_short_and_long_decimals():
    """Pins --dtype float32: "-0.1" (float32 shortest decimal) and the float64 decimal of
    float32(-0.1) differ as float64 but are the same float32."""
    long = float(np.float32(-0.1))
    rec = {
        "id": "a",
        "prompt_ids": [1],
        "response_ids": [1, 2],
        "engine_logprobs": [-0.1, -0.5],
        "trainer_logprobs": [long, -0.5],
    }
    promoted = audit([rec])
    assert promoted["exact_match_fraction"] == 0.5 and promoted["compare_dtype"] == "promoted"
    f32 = audit([rec], compare_dtype="float32")
    assert f32["exact_match_fraction"] == 1.0 and f32["max_abs_diff"] == 0.0
    assert f32["compare_dtype"] == "float32"
    with pytest.raises(ValueError, match="compare_dtype"):
        audit([rec], compare_dtype="int8")
