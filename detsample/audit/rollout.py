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
                      portable: bool = False) -> list[dict]:
    """Generate ``num_sequences`` rollouts (request i has seed ``seed + i`` and arrives at
    engine step ``i * stagger``) with ``model`` (a :func:`~detsample.models.load_model`
    spec; ``model_path``: a saved reference model, for ``model="refmodel"`` only)."""
    from detsample.audit.rescore import ModelRescorer
    from detsample.errors import InvalidSamplingParams
    from detsample.params import Request, SamplingParams
    from detsample.refmodel.engine import Engine, EngineConfig
    from detsample.refmodel.schedule import Schedule
    from detsample.refmodel.tokenizer import encode

    if num_sequences < 1:
        raise InvalidSamplingParams(f"num_sequences must be >= 1, got {num_sequences}")
    if stagger < 0:
        raise InvalidSamplingParams(f"stagger must be >= 0, got {stagger}")
    rescorer = ModelRescorer(model, batch_invariant=batch_invariant, portable=portable,
                             model_path=model_path, label="--model")
    lm = rescorer.build_model()
    requests = []
    for i in range(num_sequences):
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k,
                                seed=seed + i, max_new_tokens=max_new_tokens,
                                logprobs_mode="raw")
        prompt = [t % lm.vocab_size for t in encode(PROMPTS[i % len(PROMPTS)])]
        requests.append((i * stagger, Request(f"rollout-{seed}-{i}", params, prompt, [])))
    engine = Engine(lm, config=EngineConfig(max_batch_size=max_batch_size))
    result = engine.run(Schedule.of(requests))
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
