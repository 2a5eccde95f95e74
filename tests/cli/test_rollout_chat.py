"""``detsample rollout`` / ``audit`` on a chat model directory.

Bugs pinned: rollout stopped only on id 0 (``EngineConfig.eos_token_ids``' default), so
a chat model ran past its ``<|im_end|>`` (eos_token_id 2) into new turns whose tokens had
mask 1; ``--model`` took only ``module:factory`` (a directory was a usage error); prompts
had to be rendered with the chat template and tokenised by hand; a bad directory was not
one named error line.

The model: :mod:`tests.cli.chat_model` (a seeded 2-layer Llama, eos_token_id 2, a
generation config naming 2 and 5, a WordLevel tokenizer.json with a chat template).
"""

from __future__ import annotations

import json

import pytest

from detsample.cli import main
from tests.cli.chat_model import GEN_EOS, IM_END, save_chat_model


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return save_chat_model(tmp_path_factory.mktemp("chat") / "model")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "hello world"}]},
        {"messages": [{"role": "user", "content": "the cat is good"}], "id": "c2"},
        {"prompt": "a dog is"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rollout(out, chat_dir, prompts, *extra) -> list[dict]:
    code = main(
        [
            "rollout",
            str(out),
            "--model",
            str(chat_dir),
            "--prompts",
            str(prompts),
            "--chat-template",
            "--n",
            "4",
            "--max-new-tokens",
            "24",
            "--max-batch-size",
            "1",
            *extra,
        ]
    )
    assert code == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_rollout_stops_at_the_models_end_tokens_by_default(tmp_path, chat_dir, prompts, capsys):
    recs = _rollout(tmp_path / "r.jsonl", chat_dir, prompts)
    assert "eos token ids: [2, 5]" in capsys.readouterr().out  # config's 2 | generation's [2, 5]
    ends = {IM_END, GEN_EOS}
    for r in recs:
        body = r["response_ids"][:-1]
        assert not ends & set(body), r  # nothing emitted after an end token
        assert len(r["mask"]) == len(r["engine_logprobs"]) == len(r["response_ids"])
    assert any(r["response_ids"][-1] == IM_END for r in recs)
    # the chat template rendered the messages: <|im_start|> user hello world <|im_end|> ...
    assert recs[0]["prompt_ids"] == [1, 3, 6, 7, 2, 1, 4]


def test_ignore_eos_runs_past_the_end_of_turn(tmp_path, chat_dir, prompts, capsys):
    plain = _rollout(tmp_path / "r.jsonl", chat_dir, prompts)
    free = _rollout(tmp_path / "f.jsonl", chat_dir, prompts, "--ignore-eos")
    assert "eos token ids: none" in capsys.readouterr().out
    assert all(len(r["response_ids"]) == 24 for r in free)
    assert any(IM_END in r["response_ids"][:-1] for r in free)
    for p, f in zip(plain, free):  # the stopped response is the free one's prefix
        assert f["response_ids"][: len(p["response_ids"])] == p["response_ids"]


def test_eos_token_id_overrides_the_models(tmp_path, chat_dir, prompts):
    recs = _rollout(tmp_path / "r.jsonl", chat_dir, prompts, "--eos-token-id", "7,9", "--eos-token-id", "11")
    for r in recs:
        assert not {7, 9, 11} & set(r["response_ids"][:-1])
    assert any(IM_END in r["response_ids"] for r in recs)


def test_stop_string_ends_the_response_at_the_token_completing_it(tmp_path, chat_dir, prompts):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(chat_dir / "tokenizer.json"))
    recs = _rollout(tmp_path / "r.jsonl", chat_dir, prompts, "--ignore-eos", "--stop", "cat")
    free = _rollout(tmp_path / "f.jsonl", chat_dir, prompts, "--ignore-eos")
    cut = [r for r in recs if len(r["response_ids"]) < 24]
    assert cut
    for r in cut:
        ids = r["response_ids"]
        assert "cat" in tok.decode(ids, skip_special_tokens=False)
        assert "cat" not in tok.decode(ids[:-1], skip_special_tokens=False)
    for r, f in zip(recs, free):  # the engine stopped there: a prefix of the free run, logprobs too
        n = len(r["response_ids"])
        assert f["response_ids"][:n] == r["response_ids"]
        assert f["engine_logprobs"][:n] == r["engine_logprobs"]


def test_model_dir_rollout_then_audit_rescore_dir_is_exact(tmp_path, chat_dir, prompts, capsys):
    out = tmp_path / "r.jsonl"
    assert (
        main(
            [
                "rollout",
                str(out),
                "--model",
                str(chat_dir),
                "--prompts",
                str(prompts),
                "--chat-template",
                "--n",
                "2",
                "--max-new-tokens",
                "12",
                "--batch-invariant",
            ]
        )
        == 0
    )
    assert "model: " + str(chat_dir) + " (float32)" in capsys.readouterr().out
    report = tmp_path / "a.json"
    assert main(["audit", str(out), "--rescore", str(chat_dir), "--batch-invariant", "--json", str(report)]) == 0
    doc = json.loads(report.read_text())
    metrics = doc.get("metrics", doc)
    assert metrics["exact_match_fraction"] == 1.0


def test_dtype_is_stated(tmp_path, chat_dir, prompts, capsys):
    _rollout(tmp_path / "r.jsonl", chat_dir, prompts, "--dtype", "bfloat16")
    assert f"model: {chat_dir} (bfloat16)" in capsys.readouterr().out


def test_a_model_without_chat_template_names_file_and_row(tmp_path, prompts, capsys):
    bare = save_chat_model(tmp_path / "bare", template=False)
    code = main(
        ["rollout", str(tmp_path / "r.jsonl"), "--model", str(bare), "--prompts", str(prompts), "--chat-template"]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"{prompts}:1" in err and "no chat template" in err
    assert "Traceback" not in err


def test_messages_without_chat_template_flag_are_refused(tmp_path, chat_dir, prompts, capsys):
    code = main(["rollout", str(tmp_path / "r.jsonl"), "--model", str(chat_dir), "--prompts", str(prompts)])
    err = capsys.readouterr().err
    assert code == 2 and f"{prompts}:1" in err and "--chat-template" in err


def _broken_dirs(tmp_path, chat_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    bad_weights = tmp_path / "badw"
    bad_weights.mkdir()
    (bad_weights / "config.json").write_text((chat_dir / "config.json").read_text())
    (bad_weights / "model.safetensors").write_bytes(b"not a safetensors file")
    bad_config = tmp_path / "badc"
    bad_config.mkdir()
    (bad_config / "config.json").write_text("{not json")
    return [
        (empty, "no config.json"),
        (bad_weights, "cannot load it"),
        (bad_config, "config.json is not readable JSON"),
        (tmp_path / "missing/", "no such directory"),
    ]


@pytest.mark.parametrize("command", ["rollout", "audit"])
def test_bad_model_directory_is_one_named_error(tmp_path, chat_dir, capsys, command):
    rollout = tmp_path / "ok.jsonl"
    rollout.write_text(
        json.dumps({"id": "a", "prompt_ids": [1, 2], "response_ids": [3], "engine_logprobs": [-1.0], "mask": [1]})
        + "\n"
    )
    for directory, message in _broken_dirs(tmp_path, chat_dir):
        args = (
            ["rollout", str(tmp_path / "r.jsonl"), "--model", str(directory)]
            if command == "rollout"
            else ["audit", str(rollout), "--rescore", str(directory)]
        )
        code = main(args)
        err = capsys.readouterr().err
        assert code == 2, (directory, err)
        assert message in err and str(directory).rstrip("/") in err and "Traceback" not in err


def test_draft_model_dir_writes_the_plain_runs_file(tmp_path, chat_dir, prompts):
    common = [
        "--model",
        str(chat_dir),
        "--prompts",
        str(prompts),
        "--chat-template",
        "--max-new-tokens",
        "10",
        "--batch-invariant",
    ]
    assert main(["rollout", str(tmp_path / "a.jsonl"), *common]) == 0
    assert (
        main(
            [
                "rollout",
                str(tmp_path / "b.jsonl"),
                *common,
                "--draft-model",
                str(chat_dir),
                "--num-speculative-tokens",
                "3",
            ]
        )
        == 0
    )
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--eos-token-id", "two"], "must be token ids separated by commas"),
        (["--eos-token-id", "-2"], "token ids must be >= 0"),
        (["--dtype", "float64"], "must be one of float32, bfloat16, float16"),
    ],
)
def test_bad_end_options_are_parse_errors(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        main(["rollout", str(tmp_path / "r.jsonl"), *args])
    assert info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,message",
    [
        (["--ignore-eos", "--eos-token-id", "2"], "contradict"),
        (["--stop", "cat"], "need a tokenizer"),
        (["--eos-token-id", "512"], "end token id 512 is outside the model's vocabulary of 512"),
        (["--chat-template"], "--chat-template renders --prompts messages"),
    ],
)
def test_contradictory_or_impossible_end_options_exit_2(tmp_path, capsys, args, message):
    code = main(["rollout", str(tmp_path / "r.jsonl"), "--num-sequences", "1", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
