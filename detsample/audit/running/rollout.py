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

import itertools
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


def read_prompts(path: str, tokenizer=None, *, chat_template: bool = False) -> list[Prompt]:
    """The prompts of a JSONL file, one object per line: ``prompt_ids`` (a list of token
    ids), ``prompt`` (text, encoded with ``tokenizer``: a path to a ``tokenizer.json`` or a
    model directory, or a loaded :class:`~detsample.audit.running.text.TextTokenizer`), or,
    with ``chat_template``, ``messages`` (``[{"role", "content"}, ...]`` rendered by the
    tokenizer's own chat template with the generation prompt, then encoded); optional ``id``
    and ``seed``. Errors name the file, the line, the field and the value
    (:class:`~detsample.errors.InvalidSamplingParams`). Read through the input layer: a
    regular file only (a FIFO or a device is refused before it is opened), lines of at most
    :data:`~detsample.inputs.PROMPT_LINE_BYTES`, JSON nested within the parser's limit."""
    from detsample.errors import InvalidSamplingParams
    from detsample.inputs import PROMPT_LINE_BYTES, InputError, input_file, read_line

    try:
        input_file(path)
    except InputError as exc:
        raise InvalidSamplingParams(str(exc)) from None
    tok = _tokenizer(tokenizer)
    out = []
    with open(path, "rb") as fh:
        for line in itertools.count(1):
            where = f"{path}:{line}"
            try:
                raw = read_line(fh, PROMPT_LINE_BYTES, where)
                text = raw.decode("utf-8")
            except InputError as exc:
                raise InvalidSamplingParams(str(exc)) from None
            except UnicodeDecodeError as exc:
                raise InvalidSamplingParams(f"{where}: not UTF-8 text (byte {exc.start})") from None
            if not raw:
                break
            if text.strip():
                out.append(_prompt_line(text, where, tok, chat_template))
    if not out:
        raise InvalidSamplingParams(f"{path}: no prompts (one JSON object per line with prompt_ids)")
    return out


def _tokenizer(tokenizer):
    if tokenizer is None or not isinstance(tokenizer, (str, Path)):
        return tokenizer
    from detsample.audit.running.text import load_text_tokenizer

    return load_text_tokenizer(str(tokenizer))


def _prompt_line(text: str, where: str, tok, chat_template: bool) -> Prompt:
    from detsample.errors import InvalidSamplingParams
    from detsample.inputs import loads
    from detsample.inputs.jsontext import JsonTooDeep
    from detsample.params import Request, SamplingParams

    try:
        rec = loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSamplingParams(f"{where}: not JSON ({exc.msg})") from None
    except JsonTooDeep as exc:
        raise InvalidSamplingParams(f"{where}: JSON {exc}") from None
    if not isinstance(rec, dict):
        raise InvalidSamplingParams(f"{where}: a line must be a JSON object, got {type(rec).__name__}")
    try:
        ids = _prompt_ids(rec, tok, chat_template, where)
        seed = rec.get("seed")
        if seed is not None:
            seed = SamplingParams(seed=seed).seed
        Request("p", prompt_ids=ids)  # the id rules, once
    except InvalidSamplingParams as exc:
        msg = str(exc)
        raise InvalidSamplingParams(msg if msg.startswith(where) else f"{where}: {msg}") from None
    if not ids:
        raise InvalidSamplingParams(f"{where}: prompt_ids must not be empty, got []")
    rid = rec.get("id")
    return Prompt(tuple(ids), None if rid is None else str(rid), seed)


def _prompt_ids(rec: dict, tok, chat_template: bool, where: str) -> list:
    from detsample.errors import InvalidSamplingParams

    if "prompt_ids" in rec:
        return (
            rec["prompt_ids"]
            if isinstance(rec["prompt_ids"], list)
            else _bad("prompt_ids must be a list of token ids", rec["prompt_ids"])
        )
    if "messages" in rec:
        if not chat_template:
            raise InvalidSamplingParams(
                "field 'messages' is a chat: give --chat-template (rendered by the tokenizer's own template)"
            )
        if tok is None:
            raise InvalidSamplingParams(
                "field 'messages' needs a tokenizer with a chat template (--model DIR or --tokenizer DIR)"
            )
        return tok.encode(tok.render_chat(rec["messages"], where))
    if "prompt" in rec:
        if tok is None:
            raise InvalidSamplingParams(
                "field 'prompt' is text: give a tokenizer (--tokenizer tokenizer.json) or prompt_ids"
            )
        if not isinstance(rec["prompt"], str):
            _bad("prompt must be a string", rec["prompt"])
        return tok.encode(rec["prompt"])
    raise InvalidSamplingParams(f"missing field 'prompt_ids' (keys: {sorted(rec)[:8]})")


def _bad(what: str, value: object):
    from detsample.errors import InvalidSamplingParams

    raise InvalidSamplingParams(f"{what}, got {value!r:.60}")


@dataclass(frozen=True)
class Ending:
    """How a rollout's responses end (frozen, validated).

    eos_token_ids: None = the model's own (:func:`detsample.models.model_eos_token_ids`: a
    Hugging Face model's config and generation-config ``eos_token_id``, united, as vLLM and
    HF ``generate`` read them; id 0 for the reference model and the built-in tiny models);
    a tuple overrides them. ignore_eos: no EOS stop at all (stop ids and strings still
    stop). stop_token_ids: every request's ``SamplingParams.stop_token_ids``. stop: stop
    strings, searched in the decoded response (needs ``tokenizer``: a tokenizer.json or a
    model directory). The token that ends a response is part of it (vLLM's ``token_ids``);
    no later token is emitted or masked in.
    """

    eos_token_ids: tuple[int, ...] | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        from detsample.audit.running.text import check_stop_strings
        from detsample.errors import InvalidSamplingParams
        from detsample.params import SamplingParams

        if self.eos_token_ids is not None:
            ids = SamplingParams(stop_token_ids=self.eos_token_ids).stop_token_ids
            object.__setattr__(self, "eos_token_ids", ids)
        object.__setattr__(self, "stop_token_ids", SamplingParams(stop_token_ids=self.stop_token_ids).stop_token_ids)
        if not isinstance(self.ignore_eos, bool):
            raise InvalidSamplingParams(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.ignore_eos and self.eos_token_ids is not None:
            raise InvalidSamplingParams("ignore_eos and eos_token_ids contradict each other; give one")
        object.__setattr__(self, "stop", check_stop_strings(self.stop))
        if self.stop and self.tokenizer is None:
            raise InvalidSamplingParams(
                f"stop strings {list(self.stop)} need a tokenizer (--tokenizer, or --model DIR)"
            )

    def engine_eos(self, lm) -> tuple[int, ...]:
        """The EOS ids the engine stops on for model ``lm``; an id outside its vocabulary
        is an error naming it."""
        from detsample.errors import InvalidSamplingParams
        from detsample.models import model_eos_token_ids
        from detsample.refmodel.tokenizer import EOS_ID

        own = model_eos_token_ids(lm)
        eos = (
            ()
            if self.ignore_eos
            else self.eos_token_ids
            if self.eos_token_ids is not None
            else (EOS_ID,)
            if own is None
            else own
        )
        for t in eos + self.stop_token_ids:
            if t >= lm.vocab_size:
                raise InvalidSamplingParams(f"end token id {t} is outside the model's vocabulary of {lm.vocab_size}")
        return eos


def generate_rollouts(
    num_sequences: int = 8,
    *,
    max_new_tokens: int = 16,
    seed: int = 0,
    sampling=None,
    max_batch_size: int | None = 4,
    stagger: int = 1,
    with_trainer: bool = False,
    model_path: str | None = None,
    model: str = "refmodel",
    batch_invariant: bool = False,
    portable: bool = False,
    tp: int = 1,
    prompts: list[Prompt] | None = None,
    n: int = 1,
    logprobs_mode: str = "raw",
    draft_model: str | None = None,
    num_speculative_tokens: int = 0,
    on_speculative=None,
    ending: Ending = Ending(),
    dtype: str = "float32",
    on_eos=None,
    on_progress=None,
) -> list[dict]:
    """Generate rollouts: ``n`` samples of each of ``prompts`` (default: ``num_sequences``
    built-in prompts; request k arrives at engine step ``k * stagger``; the seeds are in
    the module docstring), each sampled by ``sampling`` (a
    :class:`~detsample.params.SamplingParams`: its temperature, filters, penalties, ...;
    default temperature 1, no filter; its seed, ``max_new_tokens`` and ``logprobs_mode``
    are the rollout's own) with ``model`` (a :func:`~detsample.models.load_model` spec;
    ``model_path``: a saved reference model, for ``model="refmodel"`` only), reporting
    ``engine_logprobs`` in ``logprobs_mode`` (``trainer_logprobs``, with ``with_trainer``,
    in the same mode). ``tp > 1``: the model tensor-parallel over ``tp`` local ranks (every
    rank runs the engine on the gathered logits; ``trainer_logprobs`` are then the TP
    model's too; docs/tensor-parallel.md). A (prompt, seed) pair that repeats (two
    identical responses) is warned about. ``ending``: the end tokens and stop strings
    (:class:`Ending`; ``on_eos`` receives the EOS ids the engine stopped on); ``dtype``: a
    model directory's parameter dtype; ``on_progress(done, total, label)`` is called as
    each sequence finishes sampling (tp = 1)."""
    from detsample.audit.running.rescore import ModelRescorer
    from detsample.audit.semantics import Semantics
    from detsample.errors import InvalidSamplingParams

    if num_sequences < 1:
        raise InvalidSamplingParams(f"num_sequences must be >= 1, got {num_sequences}")
    if stagger < 0:
        raise InvalidSamplingParams(f"stagger must be >= 0, got {stagger}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidSamplingParams(f"n must be an int >= 1, got {n!r}")
    sampling = _sampling(sampling, logprobs_mode)
    semantics = Semantics.of_params(sampling)
    run = dict(
        num_sequences=num_sequences,
        max_new_tokens=max_new_tokens,
        seed=seed,
        sampling=sampling,
        max_batch_size=max_batch_size,
        stagger=stagger,
        with_trainer=with_trainer,
        prompts=prompts,
        n=n,
        semantics=semantics,
        ending=ending,
    )
    if (draft_model is None) != (not num_speculative_tokens):
        raise InvalidSamplingParams(
            f"draft_model and num_speculative_tokens go together, got {draft_model!r} and {num_speculative_tokens!r}"
        )
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InvalidSamplingParams(f"tp must be an int >= 1, got {tp!r}")
    if tp > 1:
        from detsample.parallel import TPModelSpec, check_spec, launch, load_sharded

        if model_path is not None:
            raise InvalidSamplingParams("model_path (a saved reference model) cannot run tensor-parallel; give tp=1")
        if draft_model is not None:
            raise InvalidSamplingParams("speculative decoding (draft_model) runs with tp=1 only")
        if dtype != "float32":
            raise InvalidSamplingParams(f"dtype {dtype!r} runs with tp=1 only")
        spec = TPModelSpec(model, tp, batch_invariant, portable)
        check_spec(spec)
        return launch(tp, load_sharded, (spec,), _rank_rollouts, run)
    rescorer = ModelRescorer(
        model,
        batch_invariant=batch_invariant,
        portable=portable,
        model_path=model_path,
        label="--model",
        semantics=semantics,
        dtype=dtype,
    )
    lm = rescorer.build_model()
    if draft_model is not None:
        run["speculative"] = _speculative(lm, draft_model, num_speculative_tokens, batch_invariant, portable, dtype)
        run["on_speculative"] = on_speculative
    run["on_eos"], run["on_progress"] = on_eos, on_progress
    return _rollouts(lm, rescorer, **run)


def _speculative(lm, draft_model: str, k: int, batch_invariant: bool, portable: bool, dtype: str = "float32"):
    """The engine's :class:`~detsample.refmodel.speculative.Speculative` for the CLI's
    ``--draft-model`` (``ngram``: prompt lookup; else a model spec loaded in the target's
    mode) and ``--num-speculative-tokens``."""
    from detsample.errors import InvalidSamplingParams
    from detsample.models import ModelError, is_model_dir_spec, load_model
    from detsample.refmodel.speculative import DraftModel, NGram, Speculative, check_draft_model

    if draft_model == "ngram":
        return Speculative(NGram(), k)
    try:
        draft = load_model(
            draft_model,
            batch_invariant=batch_invariant,
            portable=portable,
            dtype=dtype if is_model_dir_spec(draft_model) else "float32",
        )
    except ModelError as exc:
        raise InvalidSamplingParams(f"--draft-model: {exc}") from exc
    check_draft_model(lm, draft)
    return Speculative(DraftModel(draft), k)


def _rank_rollouts(lm, comm, run: dict) -> list[dict]:
    """:func:`generate_rollouts` on one rank of a tensor-parallel group (every rank the
    same engine on the same gathered logits; rank 0's records are the result)."""
    from detsample.audit.running.rescore import rescore_with

    return _rollouts(lm, lambda p, r: rescore_with(lm, p, r, run["semantics"]).numpy(), **run)


def _sampling(sampling, logprobs_mode: str):
    """The rollout's base parameters: ``sampling`` (default SamplingParams()) in
    ``logprobs_mode``; anything but SamplingParams is an error naming it."""
    from detsample.errors import InvalidSamplingParams
    from detsample.params import SamplingParams

    if sampling is None:
        sampling = SamplingParams(seed=0)
    if not isinstance(sampling, SamplingParams):
        raise InvalidSamplingParams(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    return sampling.replace(logprobs_mode=logprobs_mode)


def _requests(
    lm,
    *,
    num_sequences: int,
    max_new_tokens: int,
    seed: int,
    sampling,
    stagger: int,
    prompts: list[Prompt] | None,
    n: int,
    semantics,
    ending: Ending,
) -> list[tuple[int, object, int]]:
    """(arrival step, request, group) of every sample, in record order."""
    from detsample.params import Request, child_requests
    from detsample.refmodel.tokenizer import encode

    if prompts is None:
        prompts = [
            Prompt(tuple(t % lm.vocab_size for t in encode(PROMPTS[i % len(PROMPTS)]))) for i in range(num_sequences)
        ]
    out, seen = [], set()
    for i, pr in enumerate(prompts):
        base = pr.seed if pr.seed is not None else seed + i * n
        params = sampling.replace(seed=base, max_new_tokens=max_new_tokens, stop_token_ids=ending.stop_token_ids)
        rid = pr.id if pr.id is not None else f"rollout-{seed}-{i}"
        kids = (
            child_requests(Request(rid, params, list(pr.prompt_ids), []), n)
            if n > 1
            else [Request(rid, params, list(pr.prompt_ids), [])]
        )
        for req in kids:
            key = (pr.prompt_ids, req.seed)
            if key in seen:
                warnings.warn(
                    f"rollout: prompt {i} ({rid}) repeats a (prompt, seed) pair of "
                    f"an earlier request (seed {req.seed}): its response is a copy; "
                    f"give distinct seeds or --n",
                    stacklevel=3,
                )
            seen.add(key)
            out.append((len(out) * stagger, req, i))
    return out


def _rollouts(
    lm,
    rescorer,
    *,
    max_batch_size: int | None,
    with_trainer: bool,
    speculative=None,
    on_speculative=None,
    on_eos=None,
    on_progress=None,
    **spec,
) -> list[dict]:
    from detsample.refmodel.engine import Engine, EngineConfig
    from detsample.refmodel.schedule import Schedule

    planned = _requests(lm, **spec)
    mode = spec["semantics"].logprobs_mode
    eos = spec["ending"].engine_eos(lm)
    if on_eos is not None:
        on_eos(eos)
    engine = Engine(lm, config=EngineConfig(max_batch_size=max_batch_size, eos_token_ids=eos), speculative=speculative)
    finished = itertools.count(1)
    on_finish = (
        None if on_progress is None else (lambda res: on_progress(next(finished), len(planned), "sequences sampled"))
    )
    result = engine.run(
        Schedule.of([(step, req) for step, req, _ in planned]),
        on_finish=on_finish,
        stop_after=_stop_test(spec["ending"]),
    )
    if on_speculative is not None and result.speculative is not None:
        on_speculative(result.speculative)
    records = []
    for _, req, group in planned:
        res = result[req.rid]
        keep = len(res.token_ids)
        rec = {
            "id": req.rid,
            "group": group,
            "seed": req.seed,
            "prompt_ids": list(res.prompt_ids),
            "response_ids": list(res.token_ids),
            "engine_logprobs": res.logprobs[mode].tolist(),
            "mask": [1] * keep,
        }
        if with_trainer:
            rec["trainer_logprobs"] = rescorer(rec["prompt_ids"], rec["response_ids"]).tolist()
        records.append(rec)
    return records


def _stop_test(ending: Ending):
    """The engine's ``stop_after`` for the stop strings (None without any): asked after
    every token, so generation ends at the token :func:`stop_string_cut` keeps and no
    later token is computed."""
    if not ending.stop:
        return None
    from detsample.audit.running.text import load_text_tokenizer, stop_string_hit

    tok = load_text_tokenizer(ending.tokenizer)
    return lambda request, ids: stop_string_hit(tok, ids, ending.stop)
