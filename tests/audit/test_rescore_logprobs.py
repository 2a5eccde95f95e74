"""Prompt logprobs and named-token logprobs on the rescoring path
(ModelRescorer.prompt_logprobs / token_logprobs), bitwise what the sampling path reports
for the same ids (vLLM ``prompt_logprobs``, SGLang ``token_ids_logprob``)."""

from __future__ import annotations

import pytest
import torch

from detsample import Request, Sampler, SamplingBatch
from detsample.audit.running.rescore import ModelRescorer
from detsample.audit.semantics import RAW, Semantics

SEMANTICS = [RAW, Semantics("processed", 0.7, -1, 0.9), Semantics("processed_fixed", 0.8, 20)]
PROMPT, RESPONSE = [3, 14, 15, 92, 65], [35, 89, 79, 32]


@pytest.mark.parametrize("sem", SEMANTICS, ids=lambda s: s.describe())
def test_named_tokens_equal_the_sampling_paths_top_logprobs(sem):
    r = ModelRescorer("refmodel", semantics=sem)
    logits = r.logits(PROMPT, RESPONSE)
    params = sem.params().replace(logprobs=6)
    for i in range(len(RESPONSE)):  # the engine's step at response position i
        batch = SamplingBatch.from_requests([Request("s", params, PROMPT, RESPONSE[:i])], vocab_size=logits.shape[1])
        out = Sampler().sample(logits[i : i + 1], batch, torch.tensor([len(PROMPT) + i - 1]))
        vals, ids = out.top_logprobs
        named = r.token_logprobs(PROMPT, RESPONSE, ids[0].tolist())[i]
        assert torch.equal(torch.from_numpy(named), vals[0])
        chosen = r.token_logprobs(PROMPT, RESPONSE, [int(out.token_ids[0])])[i]
        assert torch.equal(torch.from_numpy(chosen), out.logprobs)


def test_named_response_token_is_its_rescored_logprob():
    r = ModelRescorer("refmodel", semantics=SEMANTICS[1])
    full = r.token_logprobs(PROMPT, RESPONSE, RESPONSE)
    diag = torch.from_numpy(full).diagonal()
    assert torch.equal(diag, torch.from_numpy(r(PROMPT, RESPONSE)))


def test_prompt_logprobs_equal_rescoring_the_prompt_as_a_response():
    r = ModelRescorer("refmodel")
    lp = r.prompt_logprobs(PROMPT + RESPONSE)
    assert lp.shape == (len(PROMPT) + len(RESPONSE) - 1,)
    assert torch.equal(torch.from_numpy(lp[len(PROMPT) - 1 :]), torch.from_numpy(r(PROMPT, RESPONSE)))
    assert r.prompt_logprobs([7]).shape == (0,)
