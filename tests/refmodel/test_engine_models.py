"""The engine drives any model adapter: the int64 reference model, or a float
Hugging Face model through ``detsample.models`` (under the batch-invariant mode or not).

Pins: an engine that only works with ``RefModel`` (reads ``model.config``, calls
``model.prefill``), and the claim the audit rests on: with hf-tiny-llama under the mode a
request's sampling-time logprobs equal its one-prefill rescoring bitwise and do not
depend on the schedule; with torch's default kernels they do not (negative control).
"""

from __future__ import annotations

import pytest
import torch

from detsample import Request, Sampler, SamplingParams
from detsample.models import RefModelLM, load_model
from detsample.refmodel import RefModel
from detsample.refmodel.engine import Engine, EngineConfig
from detsample.refmodel.schedule import Schedule
from detsample.refmodel.verify import alignment_mismatches, invariance_mismatches, result_diff

MIXED = [
    dict(temperature=0.8, top_p=0.9),
    dict(temperature=0.0),
    dict(temperature=1.2, top_k=20),
    dict(temperature=0.7, min_p=0.1, repetition_penalty=1.2),
]


def _schedule(max_new: int = 6) -> Schedule:
    g = torch.Generator().manual_seed(0)
    out = []
    for i, kw in enumerate(MIXED):
        prompt = torch.randint(1, 512, (3 + 4 * i,), generator=g).tolist()
        params = SamplingParams(seed=10 + i, max_new_tokens=max_new, logprobs_mode="raw", **kw)
        out.append((i, Request(f"r{i}", params, prompt)))
    return Schedule.of(out)


def test_the_reference_model_and_its_adapter_give_the_same_results():
    sched = _schedule()
    a = Engine(RefModel(), config=EngineConfig(max_batch_size=3)).run(sched)
    b = Engine(RefModelLM(), config=EngineConfig(max_batch_size=3)).run(sched)
    assert all(result_diff(a[r], b[r]) is None for r in a.results)


@pytest.fixture(scope="module")
def llama_invariant():
    return load_model("hf-tiny-llama", batch_invariant=True)


def test_hf_model_under_the_mode_aligns_and_is_schedule_invariant(llama_invariant):
    sched = _schedule()
    engine = Engine(llama_invariant, config=EngineConfig(max_batch_size=3, prefill_chunk=5))
    result = engine.run(sched)
    requests = [a.request for a in sched.arrivals]
    assert all(len(result[r.rid].token_ids) > 0 for r in requests)
    assert alignment_mismatches(llama_invariant, Sampler(), requests, result) == []
    assert invariance_mismatches(engine, sched, result) == []


def test_hf_model_on_default_kernels_does_not_align():
    """Negative control: decode rows and prefill rows round differently."""
    model = load_model("hf-tiny-llama")
    sched = _schedule(max_new=4)
    result = Engine(model, config=EngineConfig(max_batch_size=3)).run(sched)
    assert alignment_mismatches(model, Sampler(), [a.request for a in sched.arrivals], result)


class _NoLimit:
    """A minimal CausalLM without a length limit (max_seq_len None)."""

    name, vocab_size, max_seq_len = "nolimit", 16, None

    def new_cache(self):
        return []

    def forward(self, caches, chunks):
        out = []
        for c, ch in zip(caches, chunks):
            c.extend(ch)
            out.append(torch.arange(16, dtype=torch.float32).repeat(len(ch), 1))
        return out


def test_a_model_without_max_seq_len_runs_to_max_new_tokens():
    req = Request("x", SamplingParams(temperature=0.0, max_new_tokens=5), [1, 2])
    res = Engine(_NoLimit(), config=EngineConfig(eos_token_ids=(0,))).run(Schedule.of([(0, req)]))
    assert res["x"].token_ids == (15,) * 5 and res["x"].finish_reason == "length"
