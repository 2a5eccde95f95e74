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

Prompts are the reference tokenizer's byte-level ids of :data:`PROMPTS` (taken modulo
the vocabulary size for a model with fewer than 512 tokens).

With ``draft_model`` (a model spec, or ``"ngram"`` for prompt lookup) and
``num_speculative_tokens`` the engine decodes speculatively
(:mod:`detsample.refmodel.speculative`): the records are the same, byte for byte, and
``on_speculative`` receives the run's counts (acceptance rate).
"""

from __future__ import annotations

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


def generate_rollouts(num_sequences: int = 8, *, max_new_tokens: int = 16, seed: int = 0,
                      temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1,
                      max_batch_size: int | None = 4, stagger: int = 1,
                      with_trainer: bool = False, model_path: str | None = None,
                      model: str = "refmodel", batch_invariant: bool = False,
                      portable: bool = False, tp: int = 1, draft_model: str | None = None,
                      num_speculative_tokens: int = 0, on_speculative=None) -> list[dict]:
    """Generate ``num_sequences`` rollouts (request i has seed ``seed + i`` and arrives at
    engine step ``i * stagger``) with ``model`` (a :func:`~detsample.models.load_model`
    spec; ``model_path``: a saved reference model, for ``model="refmodel"`` only).
    ``tp > 1``: the model tensor-parallel over ``tp`` local ranks (every rank runs the
    engine on the gathered logits; ``trainer_logprobs`` are then the TP model's too;
    docs/tensor-parallel.md)."""
    from detsample.audit.rescore import ModelRescorer
    from detsample.errors import InvalidSamplingParams

    if num_sequences < 1:
        raise InvalidSamplingParams(f"num_sequences must be >= 1, got {num_sequences}")
    if stagger < 0:
        raise InvalidSamplingParams(f"stagger must be >= 0, got {stagger}")
    run = dict(num_sequences=num_sequences, max_new_tokens=max_new_tokens, seed=seed,
               temperature=temperature, top_p=top_p, top_k=top_k, max_batch_size=max_batch_size,
               stagger=stagger, with_trainer=with_trainer)
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
                             model_path=model_path, label="--model")
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
    from detsample.audit.rescore import rescore_with

    return _rollouts(lm, lambda p, r: rescore_with(lm, p, r).numpy(), **run)


def _rollouts(lm, rescorer, *, num_sequences: int, max_new_tokens: int, seed: int,
              temperature: float, top_p: float, top_k: int, max_batch_size: int | None,
              stagger: int, with_trainer: bool, speculative=None,
              on_speculative=None) -> list[dict]:
    from detsample.params import Request, SamplingParams
    from detsample.refmodel.engine import Engine, EngineConfig
    from detsample.refmodel.schedule import Schedule
    from detsample.refmodel.tokenizer import encode

    requests = []
    for i in range(num_sequences):
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k,
                                seed=seed + i, max_new_tokens=max_new_tokens,
                                logprobs_mode="raw")
        prompt = [t % lm.vocab_size for t in encode(PROMPTS[i % len(PROMPTS)])]
        requests.append((i * stagger, Request(f"rollout-{seed}-{i}", params, prompt, [])))
    engine = Engine(lm, config=EngineConfig(max_batch_size=max_batch_size),
                    speculative=speculative)
    result = engine.run(Schedule.of(requests))
    if on_speculative is not None and result.speculative is not None:
        on_speculative(result.speculative)
    records = []
    for _, req in requests:
        res = result[req.rid]
        rec = {"id": req.rid, "prompt_ids": list(res.prompt_ids),
               "response_ids": list(res.token_ids),
               "engine_logprobs": res.logprobs["raw"].tolist(),
               "mask": [1] * len(res.token_ids)}
        if with_trainer:
            rec["trainer_logprobs"] = rescorer(rec["prompt_ids"], rec["response_ids"]).tolist()
        records.append(rec)
    return records
