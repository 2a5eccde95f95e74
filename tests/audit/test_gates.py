"""Gates decide on what was checked (detsample/audit/running/gates.py): excluded sequences fail a
gate unless allowed with ``--max-excluded``; an audit of no token always fails, naming why.

Bugs pinned: a JSONL of 4 sequences of which 3 were excluded passed
``--max-abs-diff 0 --min-exact-match 1`` (exit 0) on the one left; a file whose every
sequence was excluded exited 0 having audited nothing.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from detsample.audit import audit, check_gates
from detsample.audit.reports.log import check_log_gates
from detsample.audit.running.gates import ExclusionLimit
from detsample.cli import main

GOOD = {
    "id": "a",
    "prompt_ids": [1],
    "response_ids": [1, 2],
    "engine_logprobs": [-0.1, -0.2],
    "trainer_logprobs": [-0.1, -0.2],
}


def _rec(**changes):
    return json.dumps(dict(GOOD, **changes))


@pytest.fixture
def quarter_file(tmp_path):
    """4 sequences, 3 excluded (NaN trainer logprob, positive logprob, count mismatch)."""
    path = tmp_path / "f.jsonl"
    path.write_text(
        "\n".join(
            [
                _rec(),
                _rec(id="b", trainer_logprobs=[float("nan"), -0.2]),
                _rec(id="c", engine_logprobs=[0.1, -0.2]),
                _rec(id="d", engine_logprobs=[-0.1]),
            ]
        )
        + "\n"
    )
    return str(path)


LIMITS = [
    # (spelling, count, fraction)
    (None, 0, None),
    ("0", 0, None),
    ("3", 3, None),
    (7, 7, None),
    ("0.25", None, 0.25),
    ("1.0", None, 1.0),
    (0.5, None, 0.5),
    (" 2 ", 2, None),
]


@pytest.mark.parametrize("text,count,frac", LIMITS)
def test_max_excluded_spellings(text, count, frac):
    lim = ExclusionLimit.of(text)
    assert (lim.count, lim.fraction) == (count, frac)


@pytest.mark.parametrize("bad", ["-1", "1.5", "x", "nan", True, -2, 2.0, "inf", ""])
def test_max_excluded_refuses_what_it_cannot_mean(bad):
    with pytest.raises(ValueError, match="max_excluded"):
        ExclusionLimit.of(bad)


GATED = [
    # (CLI args, exit status, text on stderr)
    (["--max-abs-diff", "0", "--min-exact-match", "1"], 1, "excluded_sequences = 3 of 4 > 0"),
    (["--max-abs-diff", "0"], 1, "count_mismatch: 1, nan: 1, positive_logprob: 1"),
    (["--max-excluded", "2"], 1, "excluded_sequences = 3 of 4 > 2 allowed"),
    (["--max-abs-diff", "0", "--max-excluded", "3"], 0, ""),
    (["--max-abs-diff", "0", "--max-excluded", "0.75"], 0, ""),
    (["--max-abs-diff", "0", "--max-excluded", "0.5"], 1, "0.5 of them (2) allowed"),
    ([], 0, ""),  # no gate: exclusions are reported, not failed
]


@pytest.mark.parametrize("args,code,text", GATED)
def test_a_gate_never_passes_on_excluded_rows(quarter_file, capsys, args, code, text):
    assert main(["audit", quarter_file, "--quiet", *args]) == code
    err = capsys.readouterr().err
    assert text in err
    if code == 1:
        assert "GATE FAILED" in err


def test_python_gates_follow_the_same_rule(quarter_file):
    rep = audit(quarter_file)
    assert rep["excluded_sequences"] == 3 and rep["tokens"] == 2
    assert check_gates(rep) == []
    (fail,) = check_gates(rep, max_abs_diff=0.0, min_exact_match=1.0)
    assert fail.startswith("excluded_sequences = 3 of 4")
    assert check_gates(rep, max_abs_diff=0.0, max_excluded=3) == []
    assert check_gates(rep, max_abs_diff=0.0, max_excluded=0.75) == []
    assert len(check_gates(rep, max_excluded=0.7)) == 1


def _zero_token_cases(tmp_path):
    every_excluded = tmp_path / "all_bad.jsonl"
    every_excluded.write_text(_rec(engine_logprobs=[0.5, -0.1]) + "\n" + _rec(id="b", engine_logprobs=[-0.5]) + "\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    masked = tmp_path / "masked.jsonl"
    masked.write_text(_rec(mask=[0, 0]) + "\n")
    return [
        (str(every_excluded), "all 2 sequences were excluded (count_mismatch: 1, positive_logprob: 1); first: "),
        (str(empty), "the input holds no sequence"),
        (str(masked), "the 1 valid sequences have no token with mask 1"),
    ]


def test_an_audit_of_no_token_fails_with_or_without_a_gate(tmp_path, capsys):
    for path, why in _zero_token_cases(tmp_path):
        for gates in ([], ["--max-abs-diff", "1"], ["--max-excluded", "1.0"]):
            assert main(["audit", path, "--quiet", *gates]) == 1, (path, gates)
            err = capsys.readouterr().err
            assert "no tokens audited" in err and why in err, err


def test_all_excluded_names_the_first_reason(tmp_path):
    path, _ = _zero_token_cases(tmp_path)[0]
    (fail,) = check_gates(audit(path))
    assert f"{path}:line 1: engine_logprobs: engine_logprobs[0] = 0.5" in fail


def test_padded_npz_without_prompts_is_audited(tmp_path, capsys):
    """Bug pinned: a padded NPZ with framework names mapped by --columns and no
    prompt column audited 0 of 40 sequences (each 'missing column prompt_ids') and exit 0."""
    s, r = 40, 5
    path = tmp_path / "v.npz"
    np.savez(
        path,
        uid=np.arange(s).astype(str),
        responses=np.ones((s, r), np.int64),
        rollout_log_probs=-np.ones((s, r)),
        old_log_probs=-np.ones((s, r)),
        response_mask=np.ones((s, r), np.int64),
    )
    cols = (
        "id=uid,response_ids=responses,engine_logprobs=rollout_log_probs,"
        "trainer_logprobs=old_log_probs,mask=response_mask"
    )
    js = tmp_path / "r.json"
    assert main(["audit", str(path), "--columns", cols, "--max-abs-diff", "0", "--quiet", "--json", str(js)]) == 0
    rep = json.loads(js.read_text())
    assert rep["sequences"] == 40 and rep["tokens"] == 200 and rep["excluded_sequences"] == 0


def _log_row(step, sequences, excluded, tokens):
    return {
        "step": step,
        "sequences": sequences,
        "excluded_sequences": excluded,
        "tokens": tokens,
        "exact_match_fraction": 1.0 if tokens else None,
        "mismatch_fraction": 0.0 if tokens else None,
        "mean_abs_diff": 0.0,
        "max_abs_diff": 0.0 if tokens else None,
        "k3_kl_mean": 0.0,
        "abs_diff_p99": 0.0,
        "ratio": {},
    }


LOG_CASES = [
    # (latest row, gates, failing text or None)
    (_log_row(3, 10, 0, 50), {"max_abs_diff": 0.0}, None),
    (_log_row(3, 10, 2, 50), {}, None),
    (_log_row(3, 10, 2, 50), {"max_abs_diff": 0.0}, "step 3: excluded_sequences = 2 of 12"),
    (_log_row(3, 10, 2, 50), {"max_abs_diff": 0.0, "max_excluded": 2}, None),
    (_log_row(3, 10, 2, 50), {"max_abs_diff": 0.0, "max_excluded": 0.1}, "excluded_sequences"),
    (_log_row(4, 0, 5, 0), {}, "step 4: tokens = 0: no tokens audited: all 5 sequences"),
]


@pytest.mark.parametrize("row,gates,text", LOG_CASES)
def test_audit_log_gates_follow_the_same_rules(row, gates, text):
    failures = check_log_gates([_log_row(0, 10, 0, 50), row], **gates)
    if text is None:
        assert failures == []
    else:
        assert failures and text in failures[0], failures
