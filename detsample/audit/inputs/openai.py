"""``--preset openai``: the logprobs an OpenAI-compatible server (vLLM, SGLang) returned.

One JSON line per response, any of:

* a ``/v1/completions`` response (``"object": "text_completion"``): per choice
  ``logprobs.tokens`` and ``logprobs.token_logprobs``;
* a ``/v1/chat/completions`` response (``"object": "chat.completion"``): per choice
  ``logprobs.content[i].token`` and ``.logprob``;
* either wrapped, as the OpenAI batch API (and vLLM's ``run_batch``) writes its output
  (``{"custom_id": ..., "response": {"status_code": 200, "body": {...}}}``) or as a log of
  ``{"request": ..., "response": {...}}``.

Every choice is one sequence, its id the response's ``custom_id`` or ``id`` (``#index``
appended when a response has several choices). Token ids come from the choice's
``token_ids`` (vLLM's ``return_token_ids``), else from tokens spelled ``"token_id:123"``
(vLLM's ``return_tokens_as_token_ids``), else from an integer ``token_id`` per content
entry; a response that only gives token strings is excluded with the server option to
set. The prompt's ids come from ``prompt_token_ids`` (the choice's or the response's) or
a ``prompt_ids`` field of the line; an echoed completion (``echo``, the first
``token_logprobs`` null) is split at ``usage.prompt_tokens``. A line may carry the
trainer's side: ``trainer_logprobs`` (a list, or one list per choice) and ``mask``;
otherwise ``--rescore MODEL`` computes it. The sampling options of a logged request
(``{"request": {"temperature": 0.7, "top_p": 0.9, ...}, "response": ...}``: vLLM's
``temperature``, ``top_p``, ``top_k``, ``min_p``), or the same fields of the line, are
the choices' stated semantics (per-row columns: docs/audit.md, "Per-row semantics").

:func:`records_of` maps one parsed line to audit records (the audit's own columns) or a
reason per choice it cannot read; nothing is guessed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from detsample.audit.inputs.values import count_of
from detsample.audit.semantics import ROW_FIELDS

_TOKEN_ID = re.compile(r"^token_id:(-?[0-9]+)$")
_IDS_HINT = (
    "the response gives token strings, not ids: ask the server for ids (vLLM: "
    "return_tokens_as_token_ids or return_token_ids)"
)

#: (field, kind, message): why a choice (or the line) gives no sequence
Problem = tuple[str, str, str]


def _response_of(obj: Mapping) -> tuple[Mapping | None, Problem | None]:
    """The response object of a line (unwrapping the batch API and request logs)."""
    if "choices" in obj:
        return obj, None
    resp = obj.get("response")
    if isinstance(resp, Mapping):
        if obj.get("error"):
            return None, ("response", "bad_type", f"the request failed: {obj['error']!r:.200}")
        if "body" in resp:
            status = resp.get("status_code", 200)
            if status != 200:
                return None, (
                    "response",
                    "bad_type",
                    f"the request failed with status {status!r}: {resp.get('body')!r:.200}",
                )
            resp = resp["body"]
        if isinstance(resp, Mapping) and "choices" in resp:
            return resp, None
    return None, ("choices", "missing_column", "not an OpenAI completion or chat completion response (no 'choices')")


def _ids_from_tokens(tokens: list) -> list[int] | None:
    """Ids spelled "token_id:123" (vLLM's return_tokens_as_token_ids), else None."""
    out = []
    for tok in tokens:
        m = _TOKEN_ID.match(tok) if isinstance(tok, str) else None
        if m is None:
            return None
        out.append(int(m.group(1)))
    return out


def _choice_tokens(choice: Mapping) -> tuple[list | None, list | None, Problem | None]:
    """(token spellings or ids, logprobs) of a choice."""
    lp = choice.get("logprobs")
    if not isinstance(lp, Mapping):
        return (
            None,
            None,
            ("engine_logprobs", "missing_column", "the choice has no logprobs (ask the server for logprobs)"),
        )
    if "content" in lp:  # chat
        content = lp.get("content")
        if not isinstance(content, list):
            return None, None, ("engine_logprobs", "bad_type", f"logprobs.content must be a list, got {content!r:.60}")
        toks, lps = [], []
        for k, c in enumerate(content):
            if not isinstance(c, Mapping):
                return (
                    None,
                    None,
                    ("engine_logprobs", "bad_type", f"logprobs.content[{k}] must be an object, got {c!r:.60}"),
                )
            tid = c.get("token_id")
            toks.append(tid if isinstance(tid, int) and not isinstance(tid, bool) else c.get("token"))
            lps.append(c.get("logprob"))
        return toks, lps, None
    toks, lps = lp.get("tokens"), lp.get("token_logprobs")
    if not isinstance(toks, list) or not isinstance(lps, list):
        return (
            None,
            None,
            ("engine_logprobs", "missing_column", "logprobs must hold the lists 'tokens' and 'token_logprobs'"),
        )
    return toks, lps, None


def _sequence(resp: Mapping, choice: Mapping, line: Mapping, index: int, n_choices: int) -> dict | Problem:
    toks, lps, problem = _choice_tokens(choice)
    if problem:
        return problem
    ids = choice.get("token_ids")
    if not isinstance(ids, list):
        ids = toks if all(isinstance(t, int) and not isinstance(t, bool) for t in toks) else _ids_from_tokens(toks)
    if ids is None:
        return ("response_ids", "missing_column", _IDS_HINT)
    prompt = choice.get("prompt_token_ids", resp.get("prompt_token_ids", line.get("prompt_ids")))
    usage = resp.get("usage") if isinstance(resp.get("usage"), Mapping) else {}
    if lps and lps[0] is None and "prompt_tokens" in usage:  # echo: the prompt comes first
        p, kind, problem = count_of(usage["prompt_tokens"])  # never a negative slice
        if problem:
            return ("usage.prompt_tokens", kind, problem)
        if len(lps) == len(ids) and len(ids) > p:
            prompt = prompt if isinstance(prompt, list) else ids[:p]
            ids, lps = ids[p:], lps[p:]
    rec: dict = {"response_ids": ids, "engine_logprobs": lps}
    if isinstance(prompt, list):
        rec["prompt_ids"] = prompt
    trainer = line.get("trainer_logprobs")
    if isinstance(trainer, list) and trainer and all(isinstance(x, list) for x in trainer):
        trainer = trainer[index] if index < len(trainer) else None  # one list per choice
    elif trainer is not None and n_choices > 1:  # a flat list fits one choice only
        return ("trainer_logprobs", "bad_type", f"{n_choices} choices: give one list of trainer logprobs per choice")
    if trainer is not None:
        rec["trainer_logprobs"] = trainer
    if "mask" in line:
        rec["mask"] = line["mask"]
    rec.update(_stated(line))
    base = line.get("custom_id")
    if base is None:
        base = resp.get("id", "")
    rec["id"] = base if n_choices == 1 else f"{base}#{choice.get('index', index)}"
    return rec


def _stated(line: Mapping) -> dict:
    """The sampling options a line states (the audit's per-row semantics columns): those
    of its request body (a ``{"request": ..., "response": ...}`` log; the request may be
    a batch API input line, its body under ``"body"``), a field of the line itself
    taking precedence. A request that does not say is not guessed at; a request's
    ``top_k`` 0 is vLLM's "no top-k" (-1 here)."""
    req = line.get("request")
    if isinstance(req, Mapping) and isinstance(req.get("body"), Mapping):
        req = req["body"]
    out = {c: req[c] for c in ROW_FIELDS if isinstance(req, Mapping) and req.get(c) is not None}
    if type(out.get("top_k")) is int and out["top_k"] == 0:
        out["top_k"] = -1  # vLLM's requests disable top-k with 0 or -1; detsample with -1
    out.update({c: line[c] for c in ROW_FIELDS if line.get(c) is not None})
    return out


def records_of(obj: object) -> list[dict | Problem]:
    """The audit records of one parsed line (a record per choice), or the reasons it gives
    none: each item a record (the audit's columns) or a (field, kind, message) problem."""
    if not isinstance(obj, Mapping):
        return [("<record>", "bad_type", f"expected a JSON object, got {type(obj).__name__}")]
    resp, problem = _response_of(obj)
    if problem:
        return [problem]
    choices = resp.get("choices")  # type: ignore[union-attr]
    if not isinstance(choices, list) or not choices:
        return [("choices", "bad_type", f"choices must be a non-empty list, got {choices!r:.60}")]
    out: list[dict | Problem] = []
    for k, ch in enumerate(choices):
        if not isinstance(ch, Mapping):
            out.append(("choices", "bad_type", f"choices[{k}] must be an object, got {ch!r:.60}"))
            continue
        out.append(_sequence(resp, ch, obj, k, len(choices)))  # type: ignore[arg-type]
    return out
