"""Rollouts from the continuous-batching engine, in the audit's input format.

:func:`generate_rollouts` runs N requests through the engine (staggered arrivals, so rows
join and leave a shared batch) over a model of :func:`detsample.models.load_model` (the
reference model by default; ``hf-tiny-llama``, ``pkg.module:factory``, ... with
``batch_invariant`` under the batch-invariant mode) and returns audit records: ``id``,
``prompt_ids``, ``response_ids``, ``engine_logprobs`` (the sampling-time "raw" logprobs),
``mask`` and, with ``with_trainer=True``, ``trainer_logprobs`` recomputed by one prefill.
With a batch-invariant model auditing them gives ``exact_match_fraction == 1.0`` (the
prefill/decode alignment guarantee, end to end); with a float model on torch's default
kernels the audit reports the mismatch.

Prompts are the user's (``prompts``: :class:`Prompt` records, e.g. from
:func:`read_prompts`, a JSONL file of ``prompt_ids``), or else the reference tokenizer's
byte-level ids of :data:`PROMPTS` cycled (taken modulo the vocabulary size for a model
with fewer than 512 tokens). With ``n`` samples per prompt, prompt i's request has seed
``seed + i * n`` and its sample j uses that seed ``+ j`` (vLLM's child seeds), so the n
responses of a prompt are n distinct streams; each record's ``group`` is its prompt's
index (GRPO's group).

With ``draft_model`` (a model spec, or ``"ngram"`` for prompt lookup) and
``num_speculative_tokens`` the engine decodes speculatively
(:mod:`detsample.refmodel.speculative`): the records are the same, byte for byte, and
``on_speculative`` receives the run's counts (acceptance rate).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

PROMPTS = (
    "The quick brown fox",
    "def fibonacci(n):",
    "In reinforcement learning, the policy",
    "Once upon a time",
    "SELECT * FROM",
    "The logprob of a token is",
    "1, 1, 2, 3, 5, 8,",
    "Deterministic inference means",
)


@dataclass(frozen=True)
class Prompt:
    """One prompt of a rollout: its token ids, an id for the records, and optionally its
    own seed (else the run's ``seed + i * n``)."""

    prompt_ids: tuple[int, ...]
    id: str | None = None
    seed: int | None = None


def read_prompts(path: str, tokenizer: str | None = None) -> list[Prompt]:
    """The prompts of a JSONL file, one object per line: ``prompt_ids`` (a list of token
    ids), or ``prompt`` (text, encoded with the local ``tokenizer`` file, a Hugging Face
    ``tokenizer.json``); optional ``id`` and ``seed``. Errors name the file, the line,
    the field and the value (:class:`~detsample.errors.InvalidSamplingParams`)."""
    from detsample.errors import InvalidSamplingParams
    from detsample.params import Request, SamplingParams

    encode = _text_encoder(tokenizer)
    out = []
    with open(path, encoding="utf-8") as fh:
        for line, text in enumerate(fh, 1):
            if not text.strip():
                continue
            where = f"{path}:{line}"
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InvalidSamplingParams(f"{where}: not JSON ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise InvalidSamplingParams(f"{where}: a line must be a JSON object, got "
                                            f"{type(rec).__name__}")
            try:
                ids = _prompt_ids(rec, encode)
                seed = rec.get("seed")
                if seed is not None:
                    seed = SamplingParams(seed=seed).seed
                Request("p", prompt_ids=ids)  # the id rules, once
            except InvalidSamplingParams as exc:
                raise InvalidSamplingParams(f"{where}: {exc}") from None
            if not ids:
                raise InvalidSamplingParams(f"{where}: prompt_ids must not be empty, got []")
            rid = rec.get("id")
            out.append(Prompt(tuple(ids), None if rid is None else str(rid), seed))
    if not out:
        raise InvalidSamplingParams(f"{path}: no prompts (one JSON object per line with "
                                    f"prompt_ids)")
    return out


def _prompt_ids(rec: dict, encode) -> list:
    from detsample.errors import InvalidSamplingParams

    if "prompt_ids" in rec:
        return rec["prompt_ids"] if isinstance(rec["prompt_ids"], list) else \
            _bad("prompt_ids must be a list of token ids", rec["prompt_ids"])
    if "prompt" in rec:
        if encode is None:
            raise InvalidSamplingParams("field 'prompt' is text: give a tokenizer "
                                        "(--tokenizer tokenizer.json) or prompt_ids")
        if not isinstance(rec["prompt"], str):
            _bad("prompt must be a string", rec["prompt"])
        return encode(rec["prompt"])
    raise InvalidSamplingParams(f"missing field 'prompt_ids' (keys: {sorted(rec)[:8]})")


def _bad(what: str, value: object):
    from detsample.errors import InvalidSamplingParams

    raise InvalidSamplingParams(f"{what}, got {value!r:.60}")


def _text_encoder(tokenizer: str | None):
    """``text -> ids`` of a local tokenizer.json (the ``tokenizers`` package), or None."""
    if tokenizer is None:
        return None
    from detsample.errors import InvalidSamplingParams

    if not Path(tokenizer).is_file():
        raise InvalidSamplingParams(f"tokenizer: no such file {tokenizer!r}")
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(tokenizer))
    except Exception as exc:  # noqa: BLE001 - a bad file is named, whatever the parser says
        raise InvalidSamplingParams(f"tokenizer {tokenizer}: cannot read it ({exc})") from None
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def generate_rollouts(num_sequences: int = 8, *, max_new_tokens: int = 16, seed: int = 0,
                      temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1,
                      max_batch_size: int | None = 4, stagger: int = 1,
                      with_trainer: bool = False, model_path: str | None = None,
                      model: str = "refmodel", batch_invariant: bool = False,
                      portable: bool = False, tp: int = 1, prompts: list[Prompt] | None = None,
                      n: int = 1, logprobs_mode: str = "raw", draft_model: str | None = None,
                      num_speculative_tokens: int = 0, on_speculative=None) -> list[dict]:
    """Generate rollouts: ``n`` samples of each of ``prompts`` (default: ``num_sequences``
    built-in prompts; request k arrives at engine step ``k * stagger``; the seeds are in
    the module docstring) with ``model`` (a :func:`~detsample.models.load_model` spec;
    ``model_path``: a saved reference model, for ``model="refmodel"`` only), reporting
    ``engine_logprobs`` in ``logprobs_mode`` (``trainer_logprobs``, with ``with_trainer``,
    in the same mode). ``tp > 1``: the model tensor-parallel over ``tp`` local ranks (every
    rank runs the engine on the gathered logits; ``trainer_logprobs`` are then the TP
    model's too; docs/tensor-parallel.md). A (prompt, seed) pair that repeats (two
    identical responses) is warned about."""
    from detsample.audit.running.rescore import ModelRescorer
    from detsample.audit.semantics import Semantics
    from detsample.errors import InvalidSamplingParams

    if num_sequences < 1:
        raise InvalidSamplingParams(f"num_sequences must be >= 1, got {num_sequences}")
    if stagger < 0:
        raise InvalidSamplingParams(f"stagger must be >= 0, got {stagger}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidSamplingParams(f"n must be an int >= 1, got {n!r}")
    semantics = Semantics(logprobs_mode, temperature, top_k, top_p)
    run = dict(num_sequences=num_sequences, max_new_tokens=max_new_tokens, seed=seed,
               temperature=temperature, top_p=top_p, top_k=top_k, max_batch_size=max_batch_size,
               stagger=stagger, with_trainer=with_trainer, prompts=prompts, n=n,
               semantics=semantics)
    if (draft_model is None) != (not num_speculative_tokens):
        raise InvalidSamplingParams("draft_model and num_speculative_tokens go together, got "
                                    f"{draft_model!r} and {num_speculative_tokens!r}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InvalidSamplingParams(f"tp must be an int >= 1, got {tp!r}")
    if tp > 1:
        from detsample.parallel import TPModelSpec, check_spec, launch, load_sharded

        if model_path is not None:
            raise InvalidSamplingParams("model_path (a saved reference model) cannot run "
                                        "tensor-parallel; give tp=1")
        if draft_model is not None:
            raise InvalidSamplingParams("speculative decoding (draft_model) runs with tp=1 only")
        spec = TPModelSpec(model, tp, batch_invariant, portable)
        check_spec(spec)
        return launch(tp, load_sharded, (spec,), _rank_rollouts, run)
    rescorer = ModelRescorer(model, batch_invariant=batch_invariant, portable=portable,
                             model_path=model_path, label="--model", semantics=semantics)
    lm = rescorer.build_model()
    if draft_model is not None:
        run["speculative"] = _speculative(lm, draft_model, num_speculative_tokens,
                                          batch_invariant, portable)
        run["on_speculative"] = on_speculative
    return _rollouts(lm, rescorer, **run)


def _speculative(lm, draft_model: str, k: int, batch_invariant: bool, portable: bool):
    """The engine's :class:`~detsample.refmodel.speculative.Speculative` for the CLI's
    ``--draft-model`` (``ngram``: prompt lookup; else a model spec loaded in the target's
    mode) and ``--num-speculative-tokens``."""
    from detsample.errors import InvalidSamplingParams
    from detsample.models import ModelError, load_model
    from detsample.refmodel.speculative import DraftModel, NGram, Speculative, check_draft_model

    if draft_model == "ngram":
        return Speculative(NGram(), k)
    try:
        draft = load_model(draft_model, batch_invariant=batch_invariant, portable=portable)
    except ModelError as exc:
        raise InvalidSamplingParams(f"--draft-model: {exc}") from exc
    check_draft_model(lm, draft)
    return Speculative(DraftModel(draft), k)


def _rank_rollouts(lm, comm, run: dict) -> list[dict]:
    """:func:`generate_rollouts` on one rank of a tensor-parallel group (every rank the
    same engine on the same gathered logits; rank 0's records are the result)."""
    from detsample.audit.running.rescore import rescore_with

    return _rollouts(lm, lambda p, r: rescore_with(lm, p, r, run["semantics"]).numpy(), **run)


def _requests(lm, *, num_sequences: int, max_new_tokens: int, seed: int, temperature: float,
              top_p: float, top_k: int, stagger: int, prompts: list[Prompt] | None, n: int,
              semantics) -> list[tuple[int, object, int]]:
    """(arrival step, request, group) of every sample, in record order."""
    from detsample.params import Request, SamplingParams, child_requests
    from detsample.refmodel.tokenizer import encode

    if prompts is None:
        prompts = [Prompt(tuple(t % lm.vocab_size for t in encode(PROMPTS[i % len(PROMPTS)])))
                   for i in range(num_sequences)]
    out, seen = [], set()
    for i, pr in enumerate(prompts):
        base = pr.seed if pr.seed is not None else seed + i * n
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=base,
                                max_new_tokens=max_new_tokens,
                                logprobs_mode=semantics.logprobs_mode)
        rid = pr.id if pr.id is not None else f"rollout-{seed}-{i}"
        kids = child_requests(Request(rid, params, list(pr.prompt_ids), []), n) if n > 1 \
            else [Request(rid, params, list(pr.prompt_ids), [])]
        for req in kids:
            key = (pr.prompt_ids, req.seed)
            if key in seen:
                warnings.warn(f"rollout: prompt {i} ({rid}) repeats a (prompt, seed) pair of "
                              f"an earlier request (seed {req.seed}): its response is a copy; "
                              f"give distinct seeds or --n", stacklevel=3)
            seen.add(key)
            out.append((len(out) * stagger, req, i))
    return out


def _rollouts(lm, rescorer, *, max_batch_size: int | None, with_trainer: bool,
              speculative=None, on_speculative=None, **spec) -> list[dict]:
    from detsample.refmodel.engine import Engine, EngineConfig
    from detsample.refmodel.schedule import Schedule

    planned = _requests(lm, **spec)
    mode = spec["semantics"].logprobs_mode
    engine = Engine(lm, config=EngineConfig(max_batch_size=max_batch_size),
                    speculative=speculative)
    result = engine.run(Schedule.of([(step, req) for step, req, _ in planned]))
    if on_speculative is not None and result.speculative is not None:
        on_speculative(result.speculative)
    records = []
    for _, req, group in planned:
        res = result[req.rid]
        rec = {"id": req.rid, "group": group, "seed": req.seed,
               "prompt_ids": list(res.prompt_ids), "response_ids": list(res.token_ids),
               "engine_logprobs": res.logprobs[mode].tolist(),
               "mask": [1] * len(res.token_ids)}
        if with_trainer:
            rec["trainer_logprobs"] = rescorer(rec["prompt_ids"], rec["response_ids"]).tolist()
        records.append(rec)
    return records
