"""``--preset openai`` (detsample/audit/inputs/openai.py): JSONL of OpenAI-compatible completion and
chat-completion responses with logprobs, as vLLM and SGLang return them."""

from __future__ import annotations

import json

import pytest

from detsample.audit import AuditInputError, audit
from detsample.audit.running.rollout import generate_rollouts
from detsample.cli import main


def completion(rid, ids, lps, *, prompt=None, echo_prompt=None, n_prompt=None):
    """A /v1/completions response, tokens spelled as vLLM's return_tokens_as_token_ids."""
    toks, tlps = [f"token_id:{t}" for t in ids], list(lps)
    if echo_prompt is not None:  # echo=True: the prompt first, its first logprob null
        toks = [f"token_id:{t}" for t in echo_prompt] + toks
        tlps = [None] + [-0.5] * (len(echo_prompt) - 1) + tlps
    choice = {
        "index": 0,
        "text": "...",
        "finish_reason": "length",
        "logprobs": {
            "tokens": toks,
            "token_logprobs": tlps,
            "top_logprobs": None,
            "text_offset": list(range(len(toks))),
        },
    }
    if prompt is not None:
        choice["prompt_token_ids"] = prompt
    out = {
        "id": rid,
        "object": "text_completion",
        "model": "m",
        "choices": [choice],
        "usage": {"prompt_tokens": n_prompt or 0, "completion_tokens": len(ids)},
    }
    return out


def chat(rid, choices, prompt=None):
    """A /v1/chat/completions response; each choice (ids, logprobs, how ids are given)."""
    out = {"id": rid, "object": "chat.completion", "model": "m", "choices": []}
    if prompt is not None:
        out["prompt_token_ids"] = prompt  # vLLM's return_token_ids
    for k, (ids, lps, how) in enumerate(choices):
        if how == "token_ids":  # vLLM return_token_ids: ids beside token strings
            content = [{"token": f"t{t}", "logprob": lp, "bytes": [], "top_logprobs": []} for t, lp in zip(ids, lps)]
            ch = {"index": k, "token_ids": ids, "logprobs": {"content": content}}
        elif how == "spelled":  # return_tokens_as_token_ids
            ch = {
                "index": k,
                "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(ids, lps)]},
            }
        else:  # an integer token_id per entry
            ch = {
                "index": k,
                "logprobs": {"content": [{"token": "?", "token_id": t, "logprob": lp} for t, lp in zip(ids, lps)]},
            }
        ch["message"] = {"role": "assistant", "content": "..."}
        out["choices"].append(ch)
    return out


def _write(tmp_path, lines):
    path = tmp_path / "responses.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_every_response_shape_is_read(tmp_path):
    lines = [
        dict(completion("cmpl-1", [5, 7], [-0.5, -1.25]), trainer_logprobs=[-0.5, -1.25]),
        dict(
            chat("chat-2", [([9, 8], [-0.1, -0.2], "token_ids"), ([4], [-0.3], "spelled")], prompt=[1, 2]),
            trainer_logprobs=[[-0.1, -0.2], [-0.25]],
        ),
        {
            "id": "batch_req_1",
            "custom_id": "req-7",
            "error": None,
            "trainer_logprobs": [-1.0],
            "response": {"status_code": 200, "body": completion("cmpl-3", [3], [-1.0])},
        },
        {
            "request": {"prompt": "hi"},
            "trainer_logprobs": [-2.0, -3.0],
            "response": chat("chat-4", [([6, 6], [-2.0, -3.0], "ints")]),
        },
    ]
    rep = audit(_write(tmp_path, lines), preset="openai")
    assert rep["sequences"] == 5 and rep["excluded_sequences"] == 0 and rep["tokens"] == 8
    assert rep["exact_matches"] == 7  # chat-2#1: -0.3 vs -0.25
    (worst,) = rep["worst_sequences"]
    assert worst["id"] == "chat-2#1" and worst["line"] == 2
    assert worst["max_abs_diff"] == pytest.approx(0.05)


BAD = [
    # (line, field, kind, text)
    (
        {"id": "x", "choices": [{"index": 0, "text": "a"}]},
        "engine_logprobs",
        "missing_column",
        "the choice has no logprobs",
    ),
    (
        {"id": "x", "choices": [{"index": 0, "logprobs": {"tokens": ["a"], "token_logprobs": [-1.0]}}]},
        "response_ids",
        "missing_column",
        "return_tokens_as_token_ids",
    ),
    (
        {"custom_id": "r", "response": {"status_code": 400, "body": {"error": "bad"}}},
        "response",
        "bad_type",
        "failed with status 400",
    ),
    ({"custom_id": "r", "error": {"message": "timeout"}, "response": {}}, "response", "bad_type", "the request failed"),
    ({"id": "x", "object": "text_completion"}, "choices", "missing_column", "no 'choices'"),
    ({"id": "x", "choices": []}, "choices", "bad_type", "non-empty list"),
    (
        dict(chat("x", [([1], [-1.0], "ints"), ([2], [-1.0], "ints")]), trainer_logprobs=[-1.0]),
        "trainer_logprobs",
        "bad_type",
        "one list of trainer logprobs per choice",
    ),
    (
        dict(completion("x", [1, 2], [-1.0, None]), trainer_logprobs=[-1.0, -1.0]),
        "engine_logprobs",
        "bad_type",
        "engine_logprobs[1] = None",
    ),
    ([1, 2], "<record>", "bad_type", "JSON object"),
]


@pytest.mark.parametrize("line,field,kind,text", BAD)
def test_a_response_that_gives_no_sequence_is_named(tmp_path, line, field, kind, text):
    good = dict(completion("ok", [1], [-1.0]), trainer_logprobs=[-1.0])
    rep = audit(_write(tmp_path, [good, line, good]), preset="openai")
    assert rep["sequences"] == 2 and rep["excluded_sequences"] >= 1
    issue = rep["issues"][0]
    assert (issue["line"], issue["field"], issue["kind"]) == (2, field, kind)
    assert text in issue["message"], issue


def test_echoed_prompt_is_split_off(tmp_path):
    line = dict(
        completion("e", [7, 8], [-0.5, -0.25], echo_prompt=[1, 2, 3], n_prompt=3), trainer_logprobs=[-0.5, -0.25]
    )
    rep = audit(_write(tmp_path, [line]), preset="openai")
    assert rep["sequences"] == 1 and rep["tokens"] == 2 and rep["exact_match_fraction"] == 1.0


def test_vllm_shaped_rollouts_rescored_by_the_reference_model(tmp_path, capsys):
    """The loop with a server in the middle: the reference engine's sampled tokens and
    logprobs, written as vLLM writes a completion with return_tokens_as_token_ids (and a
    chat completion with return_token_ids), audited with --rescore refmodel: every
    logprob is the prefill's, bit for bit (float32 values through JSON round-trip)."""
    recs = generate_rollouts(4, max_new_tokens=6, seed=3)
    lines = []
    for k, r in enumerate(recs):
        if k % 2:
            lines.append(completion(r["id"], r["response_ids"], r["engine_logprobs"], prompt=r["prompt_ids"]))
        else:
            lines.append(
                chat(r["id"], [(r["response_ids"], r["engine_logprobs"], "token_ids")], prompt=r["prompt_ids"])
            )
    path = _write(tmp_path, lines)
    assert (
        main(
            [
                "audit",
                path,
                "--preset",
                "openai",
                "--rescore",
                "refmodel",
                "--dtype",
                "float32",
                "--max-abs-diff",
                "0",
                "--min-exact-match",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    rep = audit(path, preset="openai", rescore="refmodel", compare_dtype="float32")
    assert rep["sequences"] == 4 and rep["tokens"] == sum(len(r["response_ids"]) for r in recs)


def test_preset_openai_reads_jsonl_only(tmp_path):
    import numpy as np

    path = tmp_path / "x.npz"
    np.savez(path, id=np.array(["a"]))
    with pytest.raises(AuditInputError, match="preset openai reads JSONL"):
        audit(str(path), preset="openai")
