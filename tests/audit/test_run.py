"""The audit facade: sharding and chunking never change a bit of the report; gates
(detsample/audit.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.audit.analysis.metrics import AuditAccumulator
from detsample.audit.running.run import AuditOptions, audit, check_gates, plan_shards, run_shard, to_json
from tests.audit.synth import synth_rollouts, to_records, write_jsonl, write_npz, write_parquet

FORMATS = [("jsonl", write_jsonl), ("npz", write_npz), ("parquet", lambda c, p: write_parquet(c, p, row_group_size=16))]

REQUIRED_KEYS = [
    "sequences",
    "tokens",
    "exact_match_fraction",
    "max_abs_diff",
    "mean_abs_diff",
    "k3_kl_mean",
    "mismatch_fraction",
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    cols = synth_rollouts(120, seed=5, mismatch_rate=0.5)
    d = tmp_path_factory.mktemp("shard")
    out = {}
    for name, writer in FORMATS:
        out[name] = str(d / f"r.{name}")
        writer(cols, out[name])
    bad = d / "bad.jsonl"  # bad lines spread over the shards
    lines = open(out["jsonl"]).read().splitlines()
    for k in (3, 50, 97):
        lines[k] = lines[k].replace('"engine_logprobs": [', '"engine_logprobs": [NaN, ', 1)
    lines.insert(70, "{not json")
    bad.write_text("\n".join(lines) + "\n")
    out["bad"] = str(bad)
    return out


@pytest.mark.parametrize("name", ["jsonl", "npz", "parquet", "bad"])
@pytest.mark.parametrize("parts", [2, 3, 7])
def test_sharded_report_is_byte_equal(files, name, parts):
    """Pins the shard merge: shards audited separately and merged in file order give the
    one-pass report, byte for byte (exact sums, exact quantiles, issues in file order)."""
    one = to_json(audit(files[name]))
    shards = plan_shards([files[name]], parts)
    assert len(shards) > 1
    total = AuditAccumulator()
    for shard in shards:
        total.merge(run_shard(shard, AuditOptions(chunk_tokens=97)))
    assert to_json(total.report()) == one


def test_worker_processes_give_the_one_process_report(files):
    """Pins --workers end to end (one spawn pool for all formats, to keep the test short)."""
    paths = [files[k] for k in ("jsonl", "npz", "parquet", "bad")]
    one = to_json(audit(paths))
    rep = audit(paths, workers=2)
    assert to_json(rep) == one
    assert [(i["line"], i["kind"]) for i in rep["issues"]] == [
        (4, "count_mismatch"),
        (51, "count_mismatch"),
        (71, "bad_json"),
        (99, "count_mismatch"),
    ]


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 3000))
def test_chunk_size_never_changes_the_report(chunk_tokens):
    """Pins streaming: any chunk size gives the one-chunk report byte for byte."""
    recs = _RECORDS
    assert to_json(audit(recs, chunk_tokens=chunk_tokens)) == _WHOLE


_RECORDS = to_records(synth_rollouts(60, seed=9, mismatch_rate=0.6))
_WHOLE = to_json(audit(_RECORDS, chunk_tokens=10**9))


def test_multiple_files_merge_like_one_file(files, tmp_path):
    cols = synth_rollouts(120, seed=5, mismatch_rate=0.5)
    recs = to_records(cols)
    one = audit(recs)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in recs[:40]))
    b.write_text("".join(json.dumps(r) + "\n" for r in recs[40:]))
    two = audit([str(a), str(b)])
    for k in REQUIRED_KEYS + ["abs_diff_quantiles", "importance_ratio", "sequence", "by_position", "by_probability"]:
        assert two[k] == one[k]


def test_report_has_required_keys_and_is_strict_json(files):
    rep = json.loads(to_json(audit(files["npz"])))
    for k in REQUIRED_KEYS:
        assert k in rep
    assert set(rep["mismatch_fraction"]) == {"0", "1e-06", "0.001", "0.01", "0.1"}


def test_to_json_writes_non_finite_as_strings():
    """Pins overflowing ratios: r = exp(800) is inf, reported as "inf", never invalid JSON."""
    rec = {"id": "a", "prompt_ids": [1], "response_ids": [1], "engine_logprobs": [-800.0], "trainer_logprobs": [0.0]}
    text = to_json(audit([rec]))
    rep = json.loads(text)
    assert rep["importance_ratio"]["max"] == "inf" and rep["k3_kl_mean"] == "inf"


GATES = [
    # (max_abs_diff gate, min_exact_match gate, report values, failing metrics)
    (0.0, None, (0.0, 1.0), []),
    (0.0, None, (1e-9, 0.5), ["max_abs_diff"]),
    (None, 1.0, (1e-9, 0.999), ["exact_match_fraction"]),
    (1e-3, 0.5, (2e-3, 0.25), ["max_abs_diff", "exact_match_fraction"]),
    (1e-3, 0.5, (None, None), ["max_abs_diff", "exact_match_fraction"]),
    (None, None, (5.0, 0.0), []),
]


@pytest.mark.parametrize("max_abs,min_exact,values,failing", GATES)
def test_gates_name_the_failing_metric(max_abs, min_exact, values, failing):
    rep = {"max_abs_diff": values[0], "exact_match_fraction": values[1]}
    failures = check_gates(rep, max_abs, min_exact)
    assert [f.split(" ")[0].rstrip(":") for f in failures] == failing


def test_workers_and_chunk_validation():
    with pytest.raises(ValueError, match="workers"):
        audit([], workers=0)
    with pytest.raises(ValueError, match="chunk_tokens"):
        audit([], chunk_tokens=0)
    with pytest.raises(ValueError, match="rescore"):
        audit([], rescore="gpt")


_PERTURB = [0.0, 5e-324, -5e-324, 1e-7, -1e-7, 0.5, -0.5]


@st.composite
def _sequences(draw):
    n = draw(st.integers(0, 10))
    e = draw(st.lists(st.floats(-50.0, 0.0, allow_nan=False) | st.just(-0.0), min_size=n, max_size=n))
    d = draw(st.lists(st.sampled_from(_PERTURB), min_size=n, max_size=n))
    mask = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    t = [min(a + b, 0.0) for a, b in zip(e, d)]
    return {
        "id": draw(st.text(max_size=3)),
        "prompt_ids": [1],
        "response_ids": list(range(n)),
        "engine_logprobs": e,
        "trainer_logprobs": t,
        "mask": mask,
    }


@settings(max_examples=30, deadline=None)
@given(st.lists(_sequences(), min_size=1, max_size=8), st.integers(1, 40))
def test_any_rollouts_any_chunking_same_report_and_oracle_counts(records, chunk_tokens):
    """Pins exact merging on adversarial values (subnormal d, -0.0, ties in |d|) and the
    counts against the plain oracle."""
    from tests.audit.test_metrics import reference

    whole = audit(records, chunk_tokens=10**9)
    assert to_json(audit(records, chunk_tokens=chunk_tokens)) == to_json(whole)
    if whole["tokens"]:
        ref = reference(records)
        assert whole["mismatch_fraction"] == ref["mismatch_fraction"]
        assert whole["exact_match_fraction"] == ref["exact_match_fraction"]
        assert whole["abs_diff_quantiles"] == ref["abs_diff_quantiles"]
        assert whole["max_abs_diff"] == ref["max_abs_diff"]
