"""The engine -> rollout -> audit loop audits to an exact match
(detsample/auditrollout.py, detsample/auditrescore.py, detsample/commands/rollout.py)."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("detsample.refmodel.engine", reason="the reference model engine is not in this build")

from detsample.audit import audit  # noqa: E402
from detsample.audit.running.rescore import ModelRescorer  # noqa: E402
from detsample.audit.running.rollout import generate_rollouts  # noqa: E402
from detsample.cli import main  # noqa: E402
from detsample.params import SamplingParams as SP

ROLLOUT_CASES = [
    # (kwargs of generate_rollouts)
    dict(num_sequences=5, max_new_tokens=10, seed=0),
    dict(
        num_sequences=6, max_new_tokens=8, seed=7, sampling=SP(temperature=0.7, top_p=0.9), max_batch_size=2, stagger=2
    ),
    dict(num_sequences=3, max_new_tokens=6, seed=3, sampling=SP(temperature=0.0)),
]


@pytest.fixture(scope="module")
def rescorer():
    return ModelRescorer()


@pytest.mark.parametrize("kwargs", ROLLOUT_CASES)
def test_engine_rollouts_rescore_to_exact_match(rescorer, kwargs):
    """Pins prefill/decode alignment end to end: sampling-time logprobs from continuous
    batching == prefill rescoring, bitwise, for every token."""
    records = generate_rollouts(**kwargs)
    rep = audit(records, rescore=rescorer)
    assert rep["sequences"] == kwargs["num_sequences"] and rep["tokens"] > 0
    assert rep["exact_match_fraction"] == 1.0 and rep["max_abs_diff"] == 0.0


def test_one_ulp_engine_error_is_caught(rescorer):
    """Pins that the loop can fail: one logprob moved by one float32 ulp is a mismatch."""
    records = generate_rollouts(num_sequences=3, max_new_tokens=8, seed=1)
    lp = np.float32(records[1]["engine_logprobs"][2])
    records[1]["engine_logprobs"][2] = float(np.nextafter(lp, np.float32(-np.inf)))
    rep = audit(records, rescore=rescorer)
    assert rep["exact_matches"] == rep["tokens"] - 1
    assert rep["sequence"]["first_divergence"]["min"] == 2
    assert rep["worst_sequences"][0]["id"] == records[1]["id"]


def test_with_trainer_writes_matching_trainer_logprobs():
    records = generate_rollouts(num_sequences=2, max_new_tokens=5, with_trainer=True)
    assert all(len(r["trainer_logprobs"]) == len(r["response_ids"]) for r in records)
    assert audit(records)["exact_match_fraction"] == 1.0


def test_rescorer_pickles_without_its_model(rescorer):
    rescorer([1, 2, 3], [4])  # loads the model
    clone = pickle.loads(pickle.dumps(rescorer))
    assert clone._state is None
    assert np.array_equal(clone([1, 2, 3], [4, 5]), rescorer([1, 2, 3], [4, 5]))


@pytest.mark.parametrize("ext", ["jsonl", "npz", "parquet"])
def test_cli_rollout_then_audit_passes_exact_gates(tmp_path, capsys, ext):
    path = str(tmp_path / f"r.{ext}")
    assert main(["rollout", path, "--num-sequences", "4", "--max-new-tokens", "6"]) == 0
    assert main(["audit", path, "--rescore", "refmodel", "--max-abs-diff", "0", "--min-exact-match", "1"]) == 0
    assert "100.0000 %" in capsys.readouterr().out


def test_cli_rollout_rejects_bad_arguments(tmp_path):
    """Usage errors (exit 2), now found when the arguments are parsed."""
    for argv in (["rollout", str(tmp_path / "r.csv")], ["rollout", str(tmp_path / "r.jsonl"), "--num-sequences", "0"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2


def test_cli_rollout_into_a_new_folder(tmp_path, capsys):
    """Bug pinned: `detsample rollout out/r.jsonl` with no `out/` crashed with a
    FileNotFoundError traceback after sampling every sequence."""
    path = tmp_path / "new" / "r.jsonl"
    assert main(["rollout", str(path), "--num-sequences", "2", "--max-new-tokens", "2"]) == 0
    assert len(path.read_text().splitlines()) == 2


def _audit_json(path: str, *flags: str, tmp_path) -> tuple[int, dict]:
    import json

    out = tmp_path / f"audit{len(flags)}.json"
    rc = main(["audit", path, "--json", str(out), "--quiet", *flags])
    return rc, json.loads(out.read_text())


def test_cli_hf_model_under_the_mode_audits_to_exact_match(tmp_path):
    """The loop with a real transformers model: the engine's sampling-time logprobs
    (continuous batching, decode) equal a one-prefill rescoring bitwise under the mode."""
    path = str(tmp_path / "r.jsonl")
    assert (
        main(
            [
                "rollout",
                path,
                "--model",
                "hf-tiny-llama",
                "--batch-invariant",
                "--num-sequences",
                "4",
                "--max-new-tokens",
                "6",
            ]
        )
        == 0
    )
    rc, rep = _audit_json(
        path,
        "--rescore",
        "hf-tiny-llama",
        "--batch-invariant",
        "--max-abs-diff",
        "0",
        "--min-exact-match",
        "1",
        tmp_path=tmp_path,
    )
    assert rc == 0 and rep["exact_match_fraction"] == 1.0 and rep["max_abs_diff"] == 0.0


def test_portable_rollout_on_another_mkl_path_audits_exactly(tmp_path, capsys):
    """The portable loop across machines: a rollout written under MKL's SSE4.2 code path
    at 1 thread (another "machine") audits exactly against a rescoring here, with the
    portable kernels on both sides; the verified kernels here do not promise it (their
    bits are this machine's BLAS: the audit reports the mismatch)."""
    import os
    import subprocess
    import sys

    path = str(tmp_path / "r.jsonl")
    env = {**os.environ, "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "detsample",
            "rollout",
            path,
            "--model",
            "hf-tiny-llama",
            "--batch-invariant",
            "--portable",
            "--num-sequences",
            "3",
            "--max-new-tokens",
            "6",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    rc, rep = _audit_json(
        path,
        "--rescore",
        "hf-tiny-llama",
        "--batch-invariant",
        "--portable",
        "--max-abs-diff",
        "0",
        "--min-exact-match",
        "1",
        tmp_path=tmp_path,
    )
    assert rc == 0 and rep["exact_match_fraction"] == 1.0 and rep["max_abs_diff"] == 0.0
    rc, rep = _audit_json(
        path,
        "--rescore",
        "hf-tiny-llama",
        "--batch-invariant",
        "--max-abs-diff",
        "0",
        "--min-exact-match",
        "1",
        tmp_path=tmp_path,
    )
    assert rc == 1 and rep["exact_match_fraction"] < 1.0
    assert main(["rollout", path, "--portable"]) == 2
    assert "give --batch-invariant too" in capsys.readouterr().err


def test_cli_hf_model_on_default_kernels_reports_the_mismatch(tmp_path, capsys):
    """Negative control: the same loop on torch's default kernels fails the exact gate."""
    path = str(tmp_path / "r.jsonl")
    assert main(["rollout", path, "--model", "hf-tiny-llama", "--num-sequences", "4", "--max-new-tokens", "6"]) == 0
    rc, rep = _audit_json(
        path, "--rescore", "hf-tiny-llama", "--max-abs-diff", "0", "--min-exact-match", "1", tmp_path=tmp_path
    )
    assert rc == 1 and rep["exact_match_fraction"] < 1.0 and 0.0 < rep["max_abs_diff"] < 1e-4
    assert "GATE FAILED" in capsys.readouterr().err


def test_rescore_takes_a_module_factory(tmp_path, monkeypatch):
    (tmp_path / "rescoremodels.py").write_text(
        "from detsample.models import build_tiny\ndef qwen():\n    return build_tiny('hf-tiny-qwen2')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    records = generate_rollouts(num_sequences=2, max_new_tokens=4, model="hf-tiny-qwen2", batch_invariant=True)
    rep = audit(records, rescore=ModelRescorer("rescoremodels:qwen", batch_invariant=True))
    assert rep["exact_match_fraction"] == 1.0
    path = str(tmp_path / "r.jsonl")
    from tests.audit.synth import from_records, write_jsonl

    write_jsonl(from_records(records), path)
    assert (
        main(
            ["audit", path, "--rescore", "rescoremodels:qwen", "--batch-invariant", "--quiet", "--min-exact-match", "1"]
        )
        == 0
    )


def test_rescore_arguments_are_checked(tmp_path, capsys):
    path = str(tmp_path / "r.jsonl")
    assert main(["rollout", path, "--num-sequences", "1", "--max-new-tokens", "2"]) == 0
    assert main(["audit", path, "--batch-invariant"]) == 2
    assert "give --rescore MODEL" in capsys.readouterr().err
    assert main(["rollout", path, "--model", "nope:missing"]) == 2
    with pytest.raises(SystemExit):
        main(["audit", path, "--rescore", "gpt-5"])
    with pytest.raises(ValueError, match="model_path is for model 'refmodel'"):
        ModelRescorer("hf-tiny-llama", model_path="x.safetensors")
    clone = pickle.loads(pickle.dumps(ModelRescorer("hf-tiny-qwen2", batch_invariant=True)))
    assert (clone.model, clone.batch_invariant, clone._state) == ("hf-tiny-qwen2", True, None)


def _panel_factory(tmp_path, monkeypatch, arch: str) -> str:
    """``panel_models:ARCH``, a user factory building the panel's seeded tiny ``arch``."""
    (tmp_path / "panel_models.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "from tests.invariant.architectures import BY_NAME, build\n"
        f"def {arch}():\n    return build(BY_NAME[{arch!r}])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"panel_models:{arch}"


LOOP_CASES = [
    # (panel architecture, the mode's flags): exact 1.0 with them, the mismatch without
    pytest.param("qwen3moe", ["--batch-invariant"], id="moe"),
    pytest.param("qwen35", ["--batch-invariant"], id="qwen35-hybrid"),
    pytest.param("qwen35", ["--batch-invariant", "--portable"], id="qwen35-hybrid-portable", marks=pytest.mark.panel),
    pytest.param("lfm2", ["--batch-invariant"], id="lfm2-shortconv", marks=pytest.mark.panel),
]


@pytest.mark.parametrize("arch,mode", LOOP_CASES)
def test_panel_model_rollout_audits_exactly_under_the_mode(tmp_path, monkeypatch, arch, mode):
    """The loop on a user factory's model: a mixture-of-experts model (a tiny Qwen3-MoE)
    and hybrids through the adapter's per-row states (a Qwen3.5-style gated delta-net
    hybrid, LFM2's short convolutions): the engine's sampling-time logprobs (continuous
    batching, ragged prefill and decode) == a one-prefill rescoring, exact 1.0 under the
    mode; the mismatch on the default kernels (negative control)."""
    spec = _panel_factory(tmp_path, monkeypatch, arch)
    path = str(tmp_path / "r.jsonl")
    try:
        assert main(["rollout", path, "--model", spec, *mode, "--num-sequences", "4", "--max-new-tokens", "6"]) == 0
        rc, rep = _audit_json(
            path, "--rescore", spec, *mode, "--max-abs-diff", "0", "--min-exact-match", "1", tmp_path=tmp_path
        )
        assert rc == 0 and rep["exact_match_fraction"] == 1.0 and rep["max_abs_diff"] == 0.0
        assert main(["rollout", path, "--model", spec, "--num-sequences", "4", "--max-new-tokens", "6"]) == 0
        rc, rep = _audit_json(path, "--rescore", spec, "--max-abs-diff", "0", tmp_path=tmp_path)
        assert rc == 1 and rep["exact_match_fraction"] < 1.0
    finally:
        sys.modules.pop("panel_models", None)


# -- the user's prompts, n samples each ---------------------------------------------------


def _prompts_file(tmp_path, lines):
    import json

    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_n_samples_per_prompt_are_distinct_and_reproducible(tmp_path):
    """Bug pinned: four requests with one prompt and one seed gave four identical
    responses, silently (a GRPO group with no variance). With --n, sample j of a prompt
    uses its seed + j (vLLM's child seeds): 4 distinct responses, the same on a rerun."""
    from detsample.audit.running.rollout import read_prompts

    prompts = read_prompts(_prompts_file(tmp_path, [{"prompt_ids": [5, 6, 7]}, {"prompt_ids": [9, 10], "id": "b"}]))
    kw = dict(prompts=prompts, n=4, max_new_tokens=8, sampling=SP(temperature=0.9), seed=10)
    a, b = generate_rollouts(**kw), generate_rollouts(**kw)
    assert a == b
    assert [r["group"] for r in a] == [0] * 4 + [1] * 4
    assert [r["seed"] for r in a] == list(range(10, 18))
    assert [r["id"] for r in a][4:] == ["b/0", "b/1", "b/2", "b/3"]
    for g in (0, 1):
        responses = {tuple(r["response_ids"]) for r in a if r["group"] == g}
        assert len(responses) == 4
    assert all(r["prompt_ids"] == [5, 6, 7] for r in a[:4])


def test_repeated_prompt_and_seed_warns(tmp_path):
    from detsample.audit.running.rollout import read_prompts

    prompts = read_prompts(
        _prompts_file(tmp_path, [{"prompt_ids": [5, 6], "seed": 3}, {"prompt_ids": [5, 6], "seed": 3}])
    )
    with pytest.warns(UserWarning, match=r"repeats a \(prompt, seed\) pair"):
        records = generate_rollouts(prompts=prompts, max_new_tokens=4)
    assert records[0]["response_ids"] == records[1]["response_ids"]


BAD_PROMPT_LINES = [  # (line, words of the error)
    ("not json", ["prompts.jsonl:1", "not JSON"]),
    ("[1, 2]", ["prompts.jsonl:1", "JSON object"]),
    ('{"ids": [1]}', ["prompts.jsonl:1", "missing field 'prompt_ids'"]),
    ('{"prompt_ids": [1, -2]}', ["prompts.jsonl:1", "prompt_ids", "-2"]),
    ('{"prompt_ids": []}', ["prompts.jsonl:1", "must not be empty"]),
    ('{"prompt_ids": "1 2"}', ["prompts.jsonl:1", "prompt_ids must be a list"]),
    ('{"prompt": "hi"}', ["prompts.jsonl:1", "tokenizer"]),
    ('{"prompt_ids": [1], "seed": -1}', ["prompts.jsonl:1", "seed", "-1"]),
]


@pytest.mark.parametrize("line,words", BAD_PROMPT_LINES)
def test_bad_prompt_lines_are_named(tmp_path, line, words):
    from detsample.audit.running.rollout import read_prompts
    from detsample.errors import InvalidSamplingParams

    path = tmp_path / "prompts.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(InvalidSamplingParams) as exc:
        read_prompts(str(path))
    assert all(w in str(exc.value) for w in words), str(exc.value)


def test_text_prompts_are_encoded_with_the_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from detsample.audit.running.rollout import read_prompts

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        ["the cat sat on the mat"] * 5,
        trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    prompts = read_prompts(_prompts_file(tmp_path, [{"prompt": "the cat"}]), str(tmp_path / "tokenizer.json"))
    assert list(prompts[0].prompt_ids) == tok.encode("the cat").ids


def test_the_schedule_changes_no_token_or_logprob_of_a_float_model_under_the_mode():
    """Every request admitted at step 0 (the CLI's default now) or one a step (its old
    schedule: each step padded its decode rows to the arriving prompt's length): the same
    records, bit for bit, on a float model under the mode."""
    run = dict(
        num_sequences=5,
        max_new_tokens=6,
        seed=4,
        sampling=SP(temperature=0.9, top_p=0.95),
        max_batch_size=3,
        model="hf-tiny-llama",
        batch_invariant=True,
    )
    at_once, staggered = generate_rollouts(**run, stagger=0), generate_rollouts(**run, stagger=1)
    assert [r["response_ids"] for r in at_once] == [r["response_ids"] for r in staggered]
    for a, b in zip(at_once, staggered):
        assert np.array_equal(
            np.asarray(a["engine_logprobs"], np.float32).view(np.uint32),
            np.asarray(b["engine_logprobs"], np.float32).view(np.uint32),
        )
