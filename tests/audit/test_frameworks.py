"""The RL frameworks' metrics (detsample/audit/analysis/frameworks.py) against an independent
re-implementation: the frameworks' own formulas written here in torch on the padded batch,
the way verl (verl/trainer/ppo/rollout_corr_helper.py: compute_is_metrics,
compute_rollout_rejection_mask + compute_rs_metrics, compute_offpolicy_metrics) and
NeMo-RL (nemo_rl/algorithms/loss_functions.py, ClippedPGLossFn: token_mult_prob_error,
gen_kl_error, policy_kl_error) compute them, including verl's
``count + 1e-8`` denominators, ``exp(clamp(., -20, 20))`` and unbiased ``torch.std``.

The audit reads the same batch through ``from_tensors`` (unpadding, validation, exact
chunked sums); every metric must agree to rounding. verl's token-level std is
E[w^2] - E[w]^2 in floats, so it is compared with an absolute tolerance.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detsample.audit import audit, from_tensors
from detsample.audit.analysis.frameworks import RS_OPTIONS, FrameworkOptions, parse_rs_thresholds

SAFETY = 20.0


def masked_sum(v, m, axis=None):
    return (v * m).sum() if axis is None else (v * m).sum(dim=axis)


def masked_mean(v, m, axis=None):  # verl_F.masked_mean
    return masked_sum(v, m, axis) / ((m.sum() if axis is None else m.sum(dim=axis)) + 1e-8)


def verl_is(log_ratio, mask, level, thr):
    if level == "token":
        lr_m = log_ratio
        raw = torch.exp(torch.clamp(log_ratio, -SAFETY, SAFETY))
    else:
        lr_m = masked_sum(log_ratio, mask, -1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(lr_m, -SAFETY, SAFETY)).expand_as(log_ratio)
    raw = raw * mask
    w = raw.clamp(max=thr)
    low = 1.0 / thr
    m = {}
    if level == "sequence":
        m["max"] = torch.exp(torch.clamp(lr_m.max(), max=SAFETY))
        m["min"] = torch.exp(lr_m.min())
        m["mean"] = masked_mean(w, mask)
        m["ratio_fraction_high"] = (lr_m > math.log(thr)).double().mean()
        m["ratio_fraction_low"] = (lr_m < math.log(low)).double().mean()
    else:
        m["mean"] = masked_mean(w, mask)
        m["ratio_fraction_high"] = masked_mean((raw > thr).double(), mask)
        m["ratio_fraction_low"] = masked_mean((raw < low).double(), mask)
        mb = mask.bool()
        m["max"] = w.masked_fill(~mb, float("-inf")).max()
        m["min"] = w.masked_fill(~mb, float("inf")).min()
    if mask.sum() > 1:
        ws = w.clamp(min=0.0, max=thr)
        mc = masked_mean(ws, mask)
        m["std"] = torch.sqrt(torch.clamp(masked_mean(ws.square(), mask) - mc.square(), min=0.0))
    else:
        m["std"] = torch.tensor(0.0)
    we = w.clamp(min=0.0, max=thr)
    norm = we / (masked_mean(we, mask) + 1e-8)
    m["eff_sample_size"] = 1.0 / masked_mean(norm.square(), mask)
    seq = masked_mean(w, mask, -1)
    m["seq_mean"] = seq.mean()
    m["seq_std"] = seq.std() if seq.numel() > 1 else torch.tensor(0.0)
    m["seq_max"], m["seq_min"] = seq.max(), seq.min()
    m["seq_max_deviation"] = (seq - 1.0).abs().max()
    raw_seq = masked_mean(raw, mask, -1)
    m["seq_fraction_high"] = (raw_seq > thr).double().mean()
    m["seq_fraction_low"] = (raw_seq < low).double().mean()
    return {f"rollout_corr/rollout_is_{k}": float(v) for k, v in m.items()}


def verl_rs(log_ratio, mask, options, thresholds):
    lrs = torch.clamp(log_ratio, -SAFETY, SAFETY)
    stats = {"k1": -lrs, "k2": 0.5 * lrs**2, "k3": torch.exp(lrs) - 1.0 - lrs}
    mb = mask.bool()
    seq_valid = mask.sum(dim=-1) > 0
    combined = torch.ones_like(mask)
    out = {}
    for opt, (lower, upper) in zip(options, thresholds):
        k1 = opt.endswith("k1")
        tok = stats[opt[-2:]]
        per_seq = None
        if opt.startswith("token"):
            stat = tok
            keep = (stat >= math.log(lower)) & (stat <= math.log(upper)) if k1 else stat <= upper
            level = "token"
        else:
            if opt.startswith("seq_sum"):
                s = masked_sum(tok, mask, -1)
            elif opt.startswith("seq_mean"):
                s = masked_mean(tok, mask, -1)
            else:
                mx = tok.masked_fill(~mb, float("-inf")).max(dim=-1).values
                s = torch.where(torch.isneginf(mx), torch.zeros_like(mx), mx)
            ks = (s >= math.log(lower)) & (s <= math.log(upper)) if k1 else s <= upper
            keep = ks.unsqueeze(-1).expand_as(mb)
            stat = s.unsqueeze(-1).expand_as(mask)
            per_seq = s
            level = "sequence"
        thr_hi = math.log(upper) if k1 else upper
        thr_lo = math.log(lower) if k1 else 0.0
        p = f"rollout_corr/rollout_rs_{opt}"
        seq_values = per_seq if per_seq is not None else masked_mean(stat, mask, -1)
        sv = seq_values[seq_valid]
        out[f"{p}_mean"] = masked_mean(stat, mask)
        if level == "sequence" and sv.numel():
            out[f"{p}_max"], out[f"{p}_min"] = sv.max(), sv.min()
            out[f"{p}_fraction_high"] = (sv > thr_hi).double().mean()
            out[f"{p}_fraction_low"] = (sv < thr_lo).double().mean() if k1 else 0.0
        else:
            out[f"{p}_max"] = stat.masked_fill(~mb, float("-inf")).max()
            out[f"{p}_min"] = stat.masked_fill(~mb, float("inf")).min()
            out[f"{p}_fraction_high"] = masked_mean((stat > thr_hi).double(), mask)
            out[f"{p}_fraction_low"] = masked_mean((stat < thr_lo).double(), mask) if k1 else 0.0
        if mask.sum() > 1:
            sc = stat.clamp(min=thr_lo if k1 else 0.0, max=thr_hi)
            mc = masked_mean(sc, mask)
            out[f"{p}_std"] = torch.sqrt(torch.clamp(masked_mean(sc.square(), mask) - mc.square(), min=0.0))
        else:
            out[f"{p}_std"] = 0.0
        if sv.numel():
            out[f"{p}_seq_mean"] = sv.mean()
            out[f"{p}_seq_std"] = sv.std() if sv.numel() > 1 else 0.0
            out[f"{p}_seq_max"], out[f"{p}_seq_min"] = sv.max(), sv.min()
            out[f"{p}_seq_max_deviation"] = sv.abs().max()
            out[f"{p}_seq_fraction_high"] = (sv > thr_hi).double().mean()
            if k1:
                out[f"{p}_seq_fraction_low"] = (sv < thr_lo).double().mean()
        kf = keep.double()
        combined = combined * kf
        out[f"{p}_masked_fraction"] = masked_mean(1 - kf, mask)
        seq_keep = (~((~keep) & mb)).all(dim=-1).double()
        vf = seq_valid.double()
        out[f"{p}_seq_masked_fraction"] = ((1 - seq_keep) * vf).sum() / vf.sum() if vf.sum() else 0.0
    out["rollout_corr/rollout_rs_masked_fraction"] = masked_mean(1 - combined, mask)
    final_keep = (combined > 0.5) & mb
    out["rollout_corr/rollout_rs_seq_masked_fraction"] = (~final_keep & mb).any(dim=-1).double().mean()
    return {k: float(v) for k, v in out.items()}


def verl_offpolicy(old, rollout, mask):
    m = {}
    mt = masked_mean(old, mask, -1)
    m["training_ppl"] = torch.exp(-mt).mean()
    m["training_log_ppl"] = (-mt).mean()
    m["kl"] = masked_mean(rollout - old, mask)
    lr = old - rollout
    m["k3_kl"] = masked_mean(torch.exp(lr) - lr - 1, mask)
    me = masked_mean(rollout, mask, -1)
    m["rollout_ppl"] = torch.exp(-me).mean()
    m["rollout_log_ppl"] = (-me).mean()
    diff = me - mt
    m["log_ppl_diff"] = diff.mean()
    m["log_ppl_abs_diff"] = diff.abs().mean()
    m["log_ppl_diff_max"], m["log_ppl_diff_min"] = diff.max(), diff.min()
    m["ppl_ratio"] = torch.exp(diff).mean()
    rho = torch.exp(torch.clamp(lr, -SAFETY, SAFETY))
    m["chi2_token"] = masked_mean(rho.square(), mask) - 1.0
    s = torch.clamp(masked_sum(lr, mask, -1), -SAFETY, SAFETY)
    m["chi2_seq"] = torch.exp(2.0 * s).mean() - 1.0
    return {f"rollout_corr/{k}": float(v) for k, v in m.items()}


def nemo_metrics(prev, gen, mask):
    n = mask.sum()

    def mm(v):  # NeMo-RL masked_mean(values, mask, global_normalization_factor=n)
        return float((v * mask).sum() / (n + 1e-8))

    def k3(logprobs, reference):  # calculate_kl(kl_type="k3", no clamps)
        logr = reference - logprobs
        return torch.exp(logr) - 1 - logr

    return {
        "token_mult_prob_error": mm(torch.exp(torch.abs(gen - prev) * mask)),
        "gen_kl_error": mm(k3(gen, prev)),
        "policy_kl_error": mm(k3(prev, gen)),
    }


def _close(ours, theirs, key):
    if key.endswith("_std") and not key.endswith("_seq_std"):
        return ours == pytest.approx(theirs, rel=1e-7, abs=1e-7)  # E[w^2]-E[w]^2 in floats
    return ours == pytest.approx(theirs, rel=1e-9, abs=1e-12)


def _check(engine, trainer, mask, opts: FrameworkOptions, chunk_tokens=1 << 18):
    b, r = engine.shape
    rep = from_tensors(
        np.zeros((b, r), dtype=np.int64),
        engine,
        trainer,
        mask,
        attention_mask=np.ones((b, r), dtype=np.int64),
        chunk_tokens=chunk_tokens,
        frameworks=opts,
    )
    assert rep["sequences"] == b and rep["excluded_sequences"] == 0
    fw = rep["frameworks"]
    e, t, m = (torch.tensor(x, dtype=torch.float64) for x in (engine, trainer, mask))
    lr = t - e
    want = {
        "rollout_is_token": verl_is(lr, m, "token", opts.rollout_is_threshold),
        "rollout_is_sequence": verl_is(lr, m, "sequence", opts.rollout_is_threshold),
        "offpolicy": verl_offpolicy(t, e, m),
    }
    rs = opts.rs
    if rs:
        want["rollout_rs"] = verl_rs(lr, m, [o for o, _, _ in rs], [(lo, up) for _, lo, up in rs])
    for section, metrics in want.items():
        got = fw["verl"][section]
        assert set(got) == set(metrics), (section, set(got) ^ set(metrics))
        for k, v in metrics.items():
            assert _close(got[k], v, k), (section, k, got[k], v)
    for k, v in nemo_metrics(t, e, m).items():
        assert _close(fw["nemo_rl"][k], v, k), (k, fw["nemo_rl"][k], v)
    return rep


# d on a grid (k / 32): a threshold comparison never depends on the last ulp of an exp
_D = st.integers(-48, 48).map(lambda k: k / 32.0)


@st.composite
def batches(draw):
    b = draw(st.integers(1, 6))
    r = draw(st.integers(1, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    engine = -rng.uniform(2.0, 8.0, size=(b, r)).round(3)
    d = np.array(draw(st.lists(_D, min_size=b * r, max_size=b * r))).reshape(b, r)
    d[rng.random((b, r)) < draw(st.sampled_from([0.0, 0.3, 0.8]))] = 0.0
    mask = (rng.random((b, r)) < draw(st.sampled_from([0.5, 0.9, 1.0]))).astype(np.int64)
    mask[0, 0] = 1  # at least one audited token (verl refuses an empty mask)
    if b > 1 and draw(st.booleans()):
        mask[-1] = 0  # a row with no audited token counts as verl counts it
    return engine, engine + d, mask


OPTION_SETS = [
    FrameworkOptions(),
    FrameworkOptions(rollout_is_threshold=1.5, rollout_rs=",".join(RS_OPTIONS), rollout_rs_threshold="1.3"),
    FrameworkOptions(
        rollout_is_threshold=3.0,
        rollout_rs="token_k1,seq_sum_k1,seq_mean_k3",
        rollout_rs_threshold="0.6_1.5,0.5_4.0,0.02",
    ),
    FrameworkOptions(rollout_is_threshold=1.0, rollout_rs=None),
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches(), opts=st.sampled_from(OPTION_SETS))
def test_metrics_equal_the_frameworks_own_formulas(batch, opts):
    _check(*batch, opts)


def test_clamps_and_overflow_follow_the_frameworks():
    """|d| > 20 hits verl's SAFETY_BOUND; d = 50 overflows nothing in verl (clamped) but
    exp(|d|) in NeMo-RL's token_mult_prob_error is large and finite; both as theirs."""
    e = np.array([[-30.0, -1.0, -2.0], [-60.0, -3.0, -0.5]])
    t = np.array([[-5.0, -26.0, -2.0], [-10.0, -3.0, -0.5]])
    _check(e, t, np.ones_like(e, dtype=np.int64), FrameworkOptions(rollout_rs=",".join(RS_OPTIONS)))


def test_the_report_does_not_depend_on_chunks_or_workers(tmp_path):
    from detsample.audit import to_json
    from tests.audit.synth import synth_rollouts, write_npz

    path = tmp_path / "r.npz"
    write_npz(synth_rollouts(60, seed=3, mismatch_rate=0.4), str(path))
    opts = dict(
        frameworks=FrameworkOptions(rollout_rs="token_k2,seq_max_k3,seq_mean_k1", rollout_rs_threshold="0.5,0.1,2.0")
    )
    one = to_json(audit(str(path), **opts))
    assert to_json(audit(str(path), chunk_tokens=37, **opts)) == one
    assert to_json(audit(str(path), workers=2, **opts)) == one


def test_exact_audit_gives_the_ideal_values():
    e = -np.arange(1, 13, dtype=np.float64).reshape(3, 4) / 7
    rep = from_tensors(np.zeros((3, 4), dtype=np.int64), e, e.copy(), None)
    fw = rep["frameworks"]
    assert fw["nemo_rl"]["token_mult_prob_error"] == pytest.approx(1.0, abs=1e-9)
    assert fw["nemo_rl"]["gen_kl_error"] == 0.0 and fw["verl"]["offpolicy"]["rollout_corr/kl"] == 0
    assert fw["verl"]["rollout_rs"]["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    assert fw["verl"]["rollout_is_token"]["rollout_corr/rollout_is_max"] == 1.0


THRESHOLDS = [
    # (options, spec, parsed)
    (("token_k1",), "2.0", ((0.5, 2.0),)),
    (("token_k1", "token_k2"), "0.8_1.25,0.1", ((0.8, 1.25), (None, 0.1))),
    (("seq_sum_k3", "seq_max_k2"), 0.5, ((None, 0.5), (None, 0.5))),
]


@pytest.mark.parametrize("options,spec,parsed", THRESHOLDS)
def test_rs_thresholds_parse_as_verl_parses_them(options, spec, parsed):
    assert parse_rs_thresholds(options, spec) == parsed


@pytest.mark.parametrize(
    "kwargs,text",
    [
        (dict(rollout_is_threshold=0.0), "rollout_is_threshold must be a finite number > 0"),
        (dict(rollout_is_threshold=float("inf")), "rollout_is_threshold"),
        (dict(rollout_rs="token_k4"), "rollout_rs option must be one of"),
        (dict(rollout_rs="token_k2", rollout_rs_threshold="0.1_0.2"), "one upper bound"),
        (dict(rollout_rs="token_k1,token_k2", rollout_rs_threshold="1,2,3"), "one per option"),
        (dict(rollout_rs="token_k1", rollout_rs_threshold="-1"), "> 0"),
    ],
)
def test_bad_framework_options_are_named(kwargs, text):
    with pytest.raises(ValueError, match=text):
        FrameworkOptions(**kwargs)
