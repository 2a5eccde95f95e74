"""``detsample rollout`` arguments (detsample/cli/rollout.py): every numeric option checked
at parse time by the rule of the field it sets, the output checked before the engine runs,
and a user's model that fails named once.

Bugs pinned: a bad --temperature or --top-p reached the engine; the format
error listed .pt, which rollout cannot write; a failing --model factory read
"rescore model: ..."; an unwritable OUT was found after sampling.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from detsample.cli import main

BAD_ARGS = [
    (["--temperature", "nan"], "temperature must be finite"),
    (["--temperature", "-1"], "temperature must be"),
    (["--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--top-k", "0"], "top_k must be -1 (disabled) or >= 1"),
    (["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
    (["--seed", "-3"], "seed must be in [0, 2**63)"),
    (["--num-sequences", "0"], "must be >= 1"),
    (["--max-batch-size", "0"], "must be >= 1"),
    (["--temperature", "warm"], "temperature must be a number"),
]


@pytest.mark.parametrize("args,message", BAD_ARGS)
def test_numeric_options_are_checked_at_parse_time(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        main(["rollout", str(tmp_path / "r.jsonl"), *args])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_format_error_names_what_rollout_writes(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["rollout", str(tmp_path / "r.pt")])
    err = capsys.readouterr().err
    assert "unknown output format (expected .jsonl, .npz or .parquet)" in err
    assert ".pt" not in err.split("expected")[1]


def test_unwritable_out_is_refused_before_sampling(tmp_path, capsys, monkeypatch):
    import detsample.audit.running.rollout as rollout

    monkeypatch.setattr(
        rollout, "generate_rollouts", lambda *a, **k: pytest.fail("the engine ran before OUT was checked")
    )
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["rollout", str(blocker / "r.jsonl")]) == 2
    assert f"{blocker} is not a directory" in capsys.readouterr().err


def test_a_failing_model_factory_is_one_named_error(tmp_path, capsys, monkeypatch):
    (tmp_path / "rollout_models.py").write_text(
        textwrap.dedent("""
        def broken():
            raise RuntimeError("no weights")
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert main(["rollout", str(tmp_path / "r.jsonl"), "--model", "rollout_models:broken"]) == 2
    finally:
        sys.modules.pop("rollout_models", None)
    err = capsys.readouterr().err
    assert err.strip() == (
        "detsample rollout: error: --model: model 'rollout_models:broken': broken() raised RuntimeError: no weights"
    )


def test_small_rollout_is_written(tmp_path, capsys):
    out = tmp_path / "deep" / "r.jsonl"
    assert main(["rollout", str(out), "--num-sequences", "2", "--max-new-tokens", "3"]) == 0
    assert len(out.read_text().splitlines()) == 2


def test_prompts_file_n_samples_each(tmp_path, capsys):
    """``rollout OUT --prompts F --n 4``: 4 responses per prompt, distinct, in groups,
    the same file on a rerun; auditing them in their mode is exact."""
    import json

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [5, 6, 7]}\n{"prompt_ids": [8, 9]}\n')
    args = [
        "--prompts",
        str(prompts),
        "--n",
        "4",
        "--temperature",
        "0.8",
        "--top-p",
        "0.95",
        "--logprobs-mode",
        "processed",
        "--max-new-tokens",
        "6",
    ]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(["rollout", str(a), *args]) == 0
    assert main(["rollout", str(b), *args]) == 0
    assert a.read_bytes() == b.read_bytes()
    recs = [json.loads(x) for x in a.read_text().splitlines()]
    assert [r["group"] for r in recs] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len({tuple(r["response_ids"]) for r in recs[:4]}) == 4
    assert (
        main(
            [
                "audit",
                str(a),
                "--rescore",
                "refmodel",
                "--logprobs-mode",
                "processed",
                "--temperature",
                "0.8",
                "--top-p",
                "0.95",
                "--max-abs-diff",
                "0",
                "--quiet",
            ]
        )
        == 0
    )


def test_tokenizer_without_prompts_is_a_usage_error(tmp_path, capsys):
    assert main(["rollout", str(tmp_path / "o.jsonl"), "--tokenizer", "t.json"]) == 2
    assert "give --prompts FILE" in capsys.readouterr().err


def test_threads_option_sets_torch_threads_and_keeps_the_bits(tmp_path, monkeypatch):
    # the bug: rollout and audit had no --threads (only OMP_NUM_THREADS)
    import torch

    seen, real, old = [], torch.set_num_threads, torch.get_num_threads()
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), real(n)))
    try:
        for n in (1, 2):
            out = tmp_path / f"r{n}.jsonl"
            assert (
                main(["rollout", str(out), "--num-sequences", "2", "--max-new-tokens", "4", "--threads", str(n)]) == 0
            )
            assert (
                main(["audit", str(out), "--rescore", "refmodel", "--threads", str(n), "--min-exact-match", "1"]) == 0
            )
    finally:
        real(old)
    assert seen == [1, 1, 2, 2]
    assert (tmp_path / "r1.jsonl").read_bytes() == (tmp_path / "r2.jsonl").read_bytes()
