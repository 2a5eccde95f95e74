"""``detsample rollout --draft-model M --num-speculative-tokens K`` writes the file the
plain command writes, byte for byte, and reports the acceptance rate.

Bugs pinned: a speculative rollout whose tokens or logprobs differ from the plain one
(draws accepted by likelihood, state of rejected drafts kept); the two options accepted
alone (silently plain); a draft of another vocabulary, or with --tp > 1, running instead
of being refused.
"""

from __future__ import annotations

import re

import pytest

from detsample.cli import main

SMALL = ["--num-sequences", "3", "--max-new-tokens", "6", "--max-batch-size", "2"]


def _rollout(tmp_path, name, *args):
    out = tmp_path / name
    assert main(["rollout", str(out), *SMALL, *args]) == 0
    return out.read_bytes()


@pytest.mark.parametrize(
    "target, draft, k",
    [
        ([], "refmodel", 2),
        ([], "ngram", 4),
        (["--temperature", "0.7", "--top-p", "0.9"], "refmodel-float", 3),
    ],
)
def test_speculative_rollout_is_the_plain_file(tmp_path, capsys, target, draft, k):
    for ext in (".jsonl", ".npz"):
        plain = _rollout(tmp_path, "plain" + ext, *target)
        spec = _rollout(tmp_path, "spec" + ext, *target, "--draft-model", draft, "--num-speculative-tokens", str(k))
        assert spec == plain
    out = capsys.readouterr().out
    assert re.search(r"speculative: acceptance rate \d\.\d{3} \(\d+ of \d+ drafted tokens\)", out)


def test_speculative_rollout_of_an_hf_model_under_the_mode_is_the_plain_file(tmp_path):
    mode = ["--model", "hf-tiny-llama", "--batch-invariant", "--num-sequences", "2", "--max-new-tokens", "4"]
    plain = _rollout(tmp_path, "plain.jsonl", *mode)
    spec = _rollout(tmp_path, "spec.jsonl", *mode, "--draft-model", "hf-tiny-llama", "--num-speculative-tokens", "2")
    assert spec == plain


@pytest.mark.parametrize(
    "args, message",
    [
        (["--draft-model", "refmodel"], "--draft-model and --num-speculative-tokens go together"),
        (["--num-speculative-tokens", "2"], "--draft-model and --num-speculative-tokens go together"),
        (["--draft-model", "refmodel", "--num-speculative-tokens", "2", "--tp", "2"], "runs with tp=1 only"),
        (["--draft-model", "nosuch", "--num-speculative-tokens", "2"], "got 'nosuch'"),
        (["--draft-model", "refmodel", "--num-speculative-tokens", "0"], "must be >= 1"),
    ],
)
def test_bad_speculative_options_are_usage_errors(tmp_path, capsys, args, message):
    try:
        code = main(["rollout", str(tmp_path / "r.jsonl"), *SMALL, *args])
    except SystemExit as exc:
        code = exc.code
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


def test_a_draft_of_another_vocabulary_is_refused(tmp_path, capsys, monkeypatch):
    (tmp_path / "spec_drafts.py").write_text(
        "from detsample.refmodel import RefModel, RefModelConfig\n"
        "def small():\n    return RefModel(RefModelConfig(vocab_size=300))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(
        [
            "rollout",
            str(tmp_path / "r.jsonl"),
            *SMALL,
            "--draft-model",
            "spec_drafts:small",
            "--num-speculative-tokens",
            "2",
        ]
    )
    assert code == 2
    assert "draft model has vocab_size=300, the target 512: they must be equal" in capsys.readouterr().err
