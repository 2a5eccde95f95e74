"""The audit rescores in the engine's logprob semantics (detsample/audit/semantics.py,
the ``semantics`` of ModelRescorer, ``--logprobs-mode`` and the filter options).

The BUG pinned: ``--rescore`` always scored raw logprobs at temperature 1, so an engine
reporting processed logprobs (T=0.7, top-p 0.9) audited to exact match 0 with max |d|
~1 and no way to say what the engine reported."""

from __future__ import annotations

import json
from contextlib import nullcontext

import numpy as np
import pytest

from detsample.audit import audit
from detsample.audit.running.rescore import ModelRescorer
from detsample.audit.running.rollout import generate_rollouts
from detsample.audit.semantics import RAW, Semantics
from detsample.cli import main
from detsample.errors import InvalidSamplingParams
from detsample.params import SamplingParams as SP

BAD_SEMANTICS = [  # (kwargs of Semantics.of, words of the error)
    (dict(logprobs_mode="greedy"), ["logprobs_mode", "'greedy'"]),
    (dict(logprobs_mode="processed", top_p=1.5), ["top_p", "1.5"]),
    (dict(logprobs_mode="processed", temperature=-1.0), ["temperature", "-1.0"]),
    (dict(logprobs_mode="processed", top_k=0), ["top_k", "0"]),
    (dict(logprobs_mode="raw", temperature=0.7), ["temperature", "'raw'", "processed"]),
]


@pytest.mark.parametrize("kwargs,words", BAD_SEMANTICS)
def test_bad_semantics_are_named(kwargs, words):
    with pytest.raises(InvalidSamplingParams) as exc:
        Semantics.of(**kwargs)
    assert all(w in str(exc.value) for w in words), str(exc.value)


def test_semantics_describe_and_flags_round_trip():
    s = Semantics.of("processed", temperature=0.7, top_p=0.9)
    assert s.describe() == "processed logprobs at temperature 0.7, top_p 0.9"
    assert s.flags() == "--logprobs-mode processed --temperature 0.7 --top-p 0.9"
    assert RAW.describe() == "raw logprobs" and RAW.flags() == "--logprobs-mode raw"


MODES = [  # (rollout's mode, the rescoring semantics that must audit exactly)
    ("raw", RAW),
    ("processed", Semantics("processed", 0.7, -1, 0.9)),
    ("processed_fixed", Semantics("processed_fixed", 0.7, -1, 0.9)),
    ("scaled", Semantics("scaled", 0.7, -1, 0.9)),
]


@pytest.fixture(scope="module")
def processed_rollouts():
    return generate_rollouts(
        num_sequences=4, max_new_tokens=10, seed=2, sampling=SP(temperature=0.7, top_p=0.9), logprobs_mode="processed"
    )


@pytest.mark.parametrize("mode,semantics", MODES)
def test_rollout_in_a_mode_audits_exactly_in_that_semantics(mode, semantics):
    records = generate_rollouts(
        num_sequences=4, max_new_tokens=10, seed=2, sampling=SP(temperature=0.7, top_p=0.9), logprobs_mode=mode
    )
    rep = audit(records, rescore=ModelRescorer("refmodel", semantics=semantics))
    assert rep["exact_match_fraction"] == 1.0 and rep["tokens"] == 40


def test_processed_engine_is_not_raw(processed_rollouts):
    """Negative control: the same processed file rescored raw (the old behaviour) or in
    detsample's fixed-point form is not an exact match."""
    raw = audit(processed_rollouts, rescore=ModelRescorer("refmodel"))
    assert raw["exact_match_fraction"] < 0.2 and raw["max_abs_diff"] > 0.1
    fixed = audit(
        processed_rollouts, rescore=ModelRescorer("refmodel", semantics=Semantics("processed_fixed", 0.7, -1, 0.9))
    )
    assert fixed["exact_match_fraction"] < 1.0 and fixed["max_abs_diff"] < 1e-5


def test_cli_rescores_in_the_given_semantics(tmp_path, processed_rollouts, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in processed_rollouts))
    base = ["audit", str(path), "--rescore", "refmodel", "--max-abs-diff", "0", "--quiet"]
    assert main(base) == 1
    assert main(base + ["--logprobs-mode", "processed", "--temperature", "0.7", "--top-p", "0.9"]) == 0


CLI_REFUSALS = [  # (extra arguments, words of the one-line error)
    (["--temperature", "0.7"], ["temperature", "--logprobs-mode processed"]),
    (["--logprobs-mode", "processed", "--top-p", "1.5"], ["top_p", "1.5"]),
]


@pytest.mark.parametrize("extra,words", CLI_REFUSALS)
def test_cli_refuses_semantics_it_would_ignore(tmp_path, processed_rollouts, capsys, extra, words):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in processed_rollouts))
    with pytest.raises(SystemExit) if "1.5" in extra else nullcontext():
        rc = main(["audit", str(path), "--rescore", "refmodel", *extra])
        assert rc == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_semantics_without_a_rescore_model_is_a_usage_error(tmp_path, processed_rollouts, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in processed_rollouts))
    assert main(["audit", str(path), "--logprobs-mode", "processed"]) == 2
    assert "give --rescore MODEL" in capsys.readouterr().err


def test_rescorer_pickles_its_semantics():
    import pickle

    r = ModelRescorer("refmodel", semantics=Semantics("processed", 0.7, 20, 0.9))
    clone = pickle.loads(pickle.dumps(r))
    assert clone.semantics == r.semantics
    assert np.array_equal(clone([1, 2, 3], [4, 5]), r([1, 2, 3], [4, 5]))
