"""verify: the alignment and invariance checks report real breaks, with position and token.

Bug pinned: a checker that passes everything (the gate would be blind); a report that
does not say where the first divergence is.
"""

from __future__ import annotations

import dataclasses

import torch

from detsample import Request, Sampler, SamplingParams
from detsample.refmodel import RefModel
from detsample.refmodel.engine import Engine
from detsample.refmodel.schedule import Schedule
from detsample.refmodel.verify import alignment_mismatches, invariance_mismatches, result_diff


class BatchLeakyModel(RefModel):
    """A broken model: logits shift with the number of sequences in a model call (a
    composition leak); a lone prefill is unaffected."""

    def forward(self, caches, chunks):
        outs = super().forward(caches, chunks)
        ramp = torch.linspace(0, 1, self.config.vocab_size)
        return [o + 1e-2 * (len(caches) - 1) * ramp for o in outs]


def requests() -> list[Request]:
    return [Request(f"r{i}", SamplingParams(seed=i, max_new_tokens=6), [1 + i, 2, 3]) for i in range(4)]


def test_clean_engine_has_no_mismatch(model):
    reqs = requests()
    sched = Schedule.of([(0, r) for r in reqs])
    eng = Engine(model)
    res = eng.run(sched)
    assert alignment_mismatches(model, Sampler(), reqs, res) == []
    assert invariance_mismatches(eng, sched, res) == []


def test_leaky_model_is_caught():
    leaky = BatchLeakyModel()
    reqs = requests()
    sched = Schedule.of([(0, r) for r in reqs])
    eng = Engine(leaky)
    res = eng.run(sched)
    inv = invariance_mismatches(eng, sched, res)
    ali = alignment_mismatches(leaky, Sampler(), reqs, res)
    assert {m.rid for m in inv} == {r.rid for r in reqs}
    assert {m.rid for m in ali} == {r.rid for r in reqs}
    # the four prompts are prefilled in one model call, so the first token already leaks
    assert all(m.position == 0 for m in ali), [str(m) for m in ali]
    assert "rescored" in str(ali[0]) and "generated position 0" in str(ali[0])


def test_result_diff_sees_a_single_bit(model):
    r = requests()[0]
    a = Engine(model).run(Schedule.of([(0, r)]))[r.rid]
    lp = a.logprobs["raw"].clone()
    lp.view(torch.int32)[3] ^= 1
    b = dataclasses.replace(a, logprobs={"raw": lp})
    d = result_diff(a, b)
    assert d is not None and d.position == 3 and d.token == a.token_ids[3]
    c = dataclasses.replace(a, token_ids=a.token_ids[:2] + (511,) + a.token_ids[3:])
    assert result_diff(a, c).position == 2
    assert result_diff(a, a) is None
