"""The semantics diagnosis (detsample/audit/analysis/diagnose.py): the audit says why the
engine's numbers differ.

The BUG pinned: a file of processed logprobs (T = 0.7, top-p 0.9) audited against raw
rescoring gave exact match 0 and max |d| ~1 with not a word about why, though the
signature (signed d by probability bucket) was in the JSON."""

from __future__ import annotations

import json

import pytest
import torch

from detsample.audit import audit
from detsample.audit.analysis.diagnose import NOISE, search, signature
from detsample.audit.running.rescore import ModelRescorer, TPRescorer
from detsample.audit.running.rollout import generate_rollouts
from detsample.audit.semantics import RAW, Semantics
from detsample.cli import main
from detsample.params import SamplingParams as SP
from tests.vllm_reference import vllm_engine_rollouts, vllm_processed

PROMPTS = [[1, 17, 33, 5], [2, 99, 4], [7, 8, 9, 10, 11], [300, 12]]


@pytest.fixture(scope="module")
def vllm_file(tmp_path_factory):
    """Processed logprobs at T = 0.7, top-p 0.9 from an engine that is not detsample
    (hf-tiny-llama's own transformers forward, vLLM's formula, torch.multinomial)."""
    from detsample.models.tiny import build_tiny

    model = build_tiny("hf-tiny-llama").eval()
    records = vllm_engine_rollouts(model, PROMPTS, temperature=0.7, top_p=0.9, max_new_tokens=12, seed=0)
    path = tmp_path_factory.mktemp("vllm") / "vllm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_foreign_processed_file_is_diagnosed_by_name_and_audits_within_noise(vllm_file):
    raw = audit(vllm_file, rescore="hf-tiny-llama")
    assert raw["max_abs_diff"] > 0.1
    dg = raw["diagnosis"]
    assert dg["explained"] is True
    assert dg["semantics"] == {
        "logprobs_mode": "processed",
        "temperature": 0.7,
        "top_k": -1,
        "top_p": 0.9,
        "min_p": 0.0,
    }
    assert dg["line"].startswith(
        "semantics: the engine's logprobs match processed logprobs at temperature 0.7, top_p 0.9"
    )
    assert "--logprobs-mode processed --temperature 0.7 --top-p 0.9" in dg["line"]
    given = audit(vllm_file, rescore=ModelRescorer("hf-tiny-llama", semantics=Semantics("processed", 0.7, -1, 0.9)))
    assert given["max_abs_diff"] <= 1e-4  # kernel noise: a full forward per step vs one prefill
    assert given["diagnosis"]["needed"] is False


def test_cli_prints_the_semantics_line(vllm_file, capsys):
    assert main(["audit", vllm_file, "--rescore", "hf-tiny-llama"]) == 0
    out = capsys.readouterr().out
    assert "semantics: the engine's logprobs match processed logprobs at temperature 0.7, top_p 0.9" in out


def test_a_model_mismatch_is_not_explained_by_semantics():
    """Negative control: engine logprobs from another model (the reference model's raw
    logprobs against hf-tiny-llama) match no semantics on the grid; the line points to
    ``detsample probe``."""
    records = generate_rollouts(num_sequences=3, max_new_tokens=8, seed=4)
    rep = audit(records, rescore="hf-tiny-llama")
    assert rep["diagnosis"]["explained"] is False
    assert "detsample probe model hf-tiny-llama" in rep["diagnosis"]["line"]


SEARCH_CASES = [  # the semantics the engine used; the search must name it
    Semantics("processed", 0.7, -1, 0.9),
    Semantics("processed", 1.3),
    Semantics("processed", 0.5, 20),
    Semantics("processed", 1.0, -1, 1.0, 0.05),
    RAW,
    Semantics("processed", 1.3, 5, 0.9),  # the combinations engines use: top-k + top-p
    Semantics("processed", 1.8, -1, 0.7, 0.02),  # min-p then top-p (vLLM's order)
]


@pytest.mark.parametrize("truth", SEARCH_CASES, ids=lambda s: s.describe())
def test_search_names_the_semantics_of_synthetic_logits(truth):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn((64, 200), generator=g) * 3
    lp = vllm_processed(logits, truth.temperature, truth.top_k, truth.top_p, truth.min_p)
    tokens = torch.multinomial(lp.exp(), 1, generator=g).view(-1)
    engine = lp.gather(1, tokens.view(-1, 1)).view(-1).double()
    found, score = search(logits, tokens, engine)
    assert found == truth and score < NOISE


@pytest.mark.parametrize("truth", SEARCH_CASES[-2:], ids=lambda s: s.describe())
def test_a_combination_is_needed_no_single_filter_explains_it(truth):
    """The two combinations above bind both filters: at the true temperature the best
    single filter (or none) is far off, so naming them needs the combined grid."""
    from detsample.audit.analysis.diagnose import SINGLE_FILTERS, _Rows, _scores

    g = torch.Generator().manual_seed(0)
    logits = torch.randn((64, 200), generator=g) * 3
    lp = vllm_processed(logits, truth.temperature, truth.top_k, truth.top_p, truth.min_p)
    tokens = torch.multinomial(lp.exp(), 1, generator=g).view(-1)
    engine = lp.gather(1, tokens.view(-1, 1)).view(-1).double()
    scores = _scores(_Rows.of(logits, tokens, engine), truth.temperature)
    assert min(v for f, v in scores.items() if f in SINGLE_FILTERS) > 0.01


def test_rows_stating_different_semantics_are_diagnosed_per_group():
    """Pins the per-group diagnosis: rows stating processed at T 0.7 (right) and rows
    stating processed at T 1.3 (the engine sampled them at T 0.5): one line per group,
    the first within noise, the second naming temperature 0.5."""
    right = generate_rollouts(
        num_sequences=2, max_new_tokens=6, seed=1, sampling=SP(temperature=0.7), logprobs_mode="processed"
    )
    wrong = generate_rollouts(
        num_sequences=2, max_new_tokens=6, seed=5, sampling=SP(temperature=0.5), logprobs_mode="processed"
    )
    for r in right:
        r.update(logprobs_mode="processed", temperature=0.7)
    for r in wrong:
        r.update(id=r["id"] + "w", logprobs_mode="processed", temperature=1.3)
    dg = audit(right + wrong, rescore="refmodel")["diagnosis"]
    first, second = dg["groups"]
    assert first["stated"]["temperature"] == 0.7 and first["max_abs_diff"] == 0.0
    assert second["semantics"] == Semantics("processed", 0.5).to_dict() and second["explained"]
    lines = dg["line"].splitlines()
    assert lines[0].startswith(
        "semantics: rows stating processed logprobs at temperature 0.7 "
        "(2 sequences): the engine's logprobs are processed"
    )
    assert lines[1].startswith(
        "semantics: rows stating processed logprobs at temperature 1.3 "
        "(2 sequences): the engine's logprobs match processed logprobs "
        "at temperature 0.5"
    )


class _OneRank:
    """A rank group of one, in this process: ``call(fn, *args)`` runs ``fn(lm, None,
    *args)`` as every rank of a TPRescorer's group does (rank 0's answer)."""

    def __init__(self, model: str) -> None:
        from detsample.models import load_model

        self.lm = load_model(model)

    def call(self, fn, *args):
        return fn(self.lm, None, *args)

    def close(self) -> None:
        pass


def _tp_diagnosis(rescorer) -> dict:
    records = generate_rollouts(
        num_sequences=2,
        max_new_tokens=6,
        seed=3,
        sampling=SP(temperature=0.7, top_p=0.9),
        logprobs_mode="processed",
        model=rescorer.model,
    )
    try:
        return audit(records, rescore=rescorer)["diagnosis"]
    finally:
        rescorer.close()


def test_the_tensor_parallel_rescorer_runs_the_same_search():
    """Pins the TP diagnosis (it gave the signature only): TPRescorer's logits, rank 0's
    answer, go through the same search, which names the engine's processed semantics
    (here its ranks are one in-process group; the opt-in test below runs two)."""
    rescorer = TPRescorer("refmodel", 2)
    rescorer._group = _OneRank("refmodel")
    dg = _tp_diagnosis(rescorer)
    assert dg["semantics"] == Semantics("processed", 0.7, -1, 0.9).to_dict()
    assert dg["explained"] and dg["max_abs_diff"] <= 1e-4


@pytest.mark.tp_full
def test_the_tensor_parallel_rescorer_diagnoses_on_two_ranks():
    dg = _tp_diagnosis(TPRescorer("hf-tiny-llama", 2, start_method="fork"))
    assert dg["semantics"] == Semantics("processed", 0.7, -1, 0.9).to_dict()
    assert dg["explained"] and dg["max_abs_diff"] <= 1e-4


SIGNATURES = [  # (mean d per probability bucket, max |d|, pattern)
    ({"[0.001, 0.01)": 0.33, "[0.1, 0.5)": -0.7}, 0.95, "sharper"),
    ({"[0.001, 0.01)": -0.2, "[0.1, 0.5)": 0.3}, 0.5, "flatter"),
    ({"[0.001, 0.01)": -0.1, "[0.1, 0.5)": -0.1}, 0.2, "renormalised"),
    ({"[0.001, 0.01)": 1e-7, "[0.1, 0.5)": -1e-7}, 4e-6, "noise"),
    ({"[0.001, 0.01)": 0.02, "[0.1, 0.5)": 0.03}, 0.3, "none"),
]


@pytest.mark.parametrize("buckets,biggest,pattern", SIGNATURES)
def test_signature_without_a_model(buckets, biggest, pattern):
    report = {
        "max_abs_diff": biggest,
        "by_probability": [{"bucket": b, "tokens": 10, "mean_diff": d} for b, d in buckets.items()],
    }
    assert signature(report)["pattern"] == pattern


def test_renormalised_claims_every_bucket_only_when_every_bucket_is_negative():
    """The bug: the signature said "d < 0 in every probability bucket ... at temperature
    1" from the token-weighted means below / above p = 0.1, while one bucket was +0.194
    (processed logprobs at T = 0.7, top-p 0.9)."""
    buckets = {"[0.0001, 0.001)": -0.4, "[0.001, 0.01)": 0.194, "[0.1, 0.5)": -0.2}
    report = {
        "max_abs_diff": 0.9,
        "by_probability": [{"bucket": b, "tokens": 100 if d < 0 else 5, "mean_diff": d} for b, d in buckets.items()],
    }
    sig = signature(report)
    assert sig["pattern"] == "renormalised"
    assert "every probability bucket" not in sig["suggests"]
    assert "temperature 1" not in sig["suggests"]


def test_the_html_report_does_not_print_a_superseded_guess():
    """With a model search that named the semantics, the page shows the signature's table
    but not its model-free guess (which may contradict the named semantics)."""
    from detsample.audit.reports.report import _diagnosis_html

    sig = {
        "pattern": "renormalised",
        "suggests": "GUESS",
        "by_probability": {"[0.1, 0.5)": -0.2},
        "mean_diff_below_0.1": -0.1,
        "mean_diff_from_0.1": -0.2,
    }
    dg = {"needed": True, "signature": sig, "line": "semantics: found", "explained": True}
    assert "GUESS" not in _diagnosis_html(dg)
    assert "GUESS" in _diagnosis_html(dict(dg, explained=None))


def test_trainer_logprobs_alone_report_the_signature():
    records = generate_rollouts(
        num_sequences=4, max_new_tokens=10, seed=2, sampling=SP(temperature=0.7, top_p=0.9), logprobs_mode="processed"
    )
    raw = generate_rollouts(
        num_sequences=4, max_new_tokens=10, seed=2, sampling=SP(temperature=0.7, top_p=0.9), with_trainer=True
    )
    for r, t in zip(records, raw):  # trainer: raw logprobs of the same tokens
        assert r["response_ids"] == t["response_ids"]
        r["trainer_logprobs"] = t["trainer_logprobs"]
    dg = audit(records)["diagnosis"]
    assert dg["semantics"] is None and dg["signature"]["pattern"] == "sharper"
    assert dg["line"].startswith("semantics: the engine's distribution is sharper")


def test_openai_preset_file_is_diagnosed(vllm_file, tmp_path, capsys):
    """The same foreign engine's responses written as OpenAI chat completions (vLLM's
    ``token_ids`` / ``prompt_token_ids``), read with ``--preset openai``: raw rescoring is
    far off and the line names the semantics; given them, max |d| is kernel noise."""
    lines = []
    for r in map(json.loads, open(vllm_file).read().splitlines()):
        content = [{"token": f"t{t}", "logprob": lp} for t, lp in zip(r["response_ids"], r["engine_logprobs"])]
        lines.append(
            {
                "id": r["id"],
                "object": "chat.completion",
                "prompt_token_ids": r["prompt_ids"],
                "choices": [{"index": 0, "token_ids": r["response_ids"], "logprobs": {"content": content}}],
            }
        )
    path = tmp_path / "openai.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    base = ["audit", str(path), "--preset", "openai", "--rescore", "hf-tiny-llama", "--json", str(tmp_path / "r.json")]
    assert main(base) == 0
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["exact_match_fraction"] == 0.0 and rep["max_abs_diff"] > 0.1
    assert (
        "semantics: the engine's logprobs match processed logprobs at temperature 0.7, "
        "top_p 0.9" in capsys.readouterr().out
    )
    assert (
        main(
            base + ["--logprobs-mode", "processed", "--temperature", "0.7", "--top-p", "0.9", "--max-abs-diff", "1e-4"]
        )
        == 0
    )
