"""detsample/processors.py: the step-1 logits-processor interface.

Pins: a per-request processor called once per row instead of once per group, updates
not delivered (or delivered after apply), a rejected request half-added to processor
state, argmax-invariant processors run on all-greedy batches (or their skip changing a
row), caller logits modified in place, and processor state going stale when one
Sampler is used with another batch.
"""

from __future__ import annotations

import pytest
import torch

from detsample import InvalidSamplingParams, Request, Sampler, SamplingBatch, SamplingParams
from detsample.processors.base import LogitsProcessor, SlotProcessor
from detsample.processors.batch_update import apply_to_slots
from tests.penalty_cases import ScaleEvenTokens, V, logits_for


class Recorder(SlotProcessor):
    """Records every update and apply; optionally argmax invariant; rejects top_k=2."""

    def __init__(self, invariant: bool = False) -> None:
        super().__init__()
        self.invariant = invariant
        self.updates: list = []
        self.applied = 0

    def validate_params(self, params):
        if params.top_k == 2:
            raise InvalidSamplingParams(f"top_k must not be 2 for Recorder, got {params.top_k}")

    def is_argmax_invariant(self):
        return self.invariant

    def make_entry(self, added):
        return added.params.seed

    def update_state(self, batch_update):
        self.updates.append(batch_update)
        super().update_state(batch_update)

    def apply(self, logits):
        self.applied += 1
        logits[:, 1] += 0.5  # in place, on purpose
        return logits


def _batch(specs, start=0):
    return SamplingBatch.from_requests(
        [Request(f"r{start + i}", SamplingParams(seed=start + i, **kw), [1], []) for i, kw in enumerate(specs)], V
    )


def _logits(batch):
    return torch.stack([logits_for(r.rid, len(o)) for r, o in zip(batch.requests, batch.output_ids)])


def test_updates_delivered_before_apply_and_none_when_unchanged():
    rec = Recorder()
    s = Sampler(processors=(rec,))
    b = _batch([{}, {}, {}])
    s.sample(_logits(b), b, torch.zeros(3, dtype=torch.int64))
    first = rec.updates[-1]
    assert [a.index for a in first.added] == [0, 1, 2] and first.batch_size == 3
    s.sample(_logits(b), b, torch.zeros(3, dtype=torch.int64))
    assert rec.updates[-1] is None
    upd = b.filter([2, 0])
    s.sample(_logits(b), b, torch.zeros(2, dtype=torch.int64))
    assert rec.updates[-1] == upd
    assert rec.slots == [2, 0]


def test_caller_logits_untouched_by_in_place_processor():
    s = Sampler(processors=(Recorder(),))
    b = _batch([{}, {}])
    x = _logits(b)
    before = x.clone()
    s.sample(x, b, torch.zeros(2, dtype=torch.int64))
    assert torch.equal(x, before)


def test_rejected_request_names_field_and_leaves_state_untouched():
    rec = Recorder()
    s = Sampler(processors=(rec,))
    b = _batch([{}, {"top_k": 2}])
    with pytest.raises(InvalidSamplingParams, match=r"'r1'.*Recorder.*top_k"):
        s.sample(_logits(b), b, torch.zeros(2, dtype=torch.int64))
    assert rec.slots == [] and rec.updates == []
    with pytest.raises(InvalidSamplingParams, match="top_k"):
        s.validate_request(b.requests[1])
    b.filter([0])
    s.sample(_logits(b), b, torch.zeros(1, dtype=torch.int64))
    assert rec.slots == [0]


def test_argmax_invariant_skipped_only_when_all_greedy():
    inv = Recorder(invariant=True)
    s = Sampler(processors=(inv,))
    g = _batch([{"temperature": 0.0}, {"temperature": 0.0}])
    s.sample(_logits(g), g, torch.zeros(2, dtype=torch.int64))
    assert inv.applied == 0 and inv.slots == [0, 1]  # state kept even when skipped
    g.merge(_batch([{"temperature": 1.0}], start=2))
    out = s.sample(_logits(g), g, torch.zeros(3, dtype=torch.int64))
    assert inv.applied == 1
    alone = _batch([{"temperature": 0.0, "logprobs_mode": "raw"}])
    ref = Sampler(processors=(Recorder(invariant=True),)).sample(
        _logits(alone), alone, torch.zeros(1, dtype=torch.int64)
    )
    assert torch.equal(out.token_ids[:1], ref.token_ids)
    assert torch.equal(out.logprobs[:1], ref.logprobs)


def test_greedy_rows_unaffected_by_argmax_invariant_processor_in_mixed_batch():
    specs = [{"temperature": 0.0, "logprobs_mode": "scaled", "logprobs": 3}, {"temperature": 1.0}]
    b = _batch(specs)
    mixed = Sampler(processors=(Recorder(invariant=True),)).sample(_logits(b), b, torch.zeros(2, dtype=torch.int64))
    a = _batch(specs[:1])
    alone = Sampler(processors=(Recorder(invariant=True),)).sample(_logits(a), a, torch.zeros(1, dtype=torch.int64))
    assert torch.equal(mixed.logprobs[:1], alone.logprobs)
    assert torch.equal(mixed.top_logprobs[0][:1], alone.top_logprobs[0])


def test_per_request_processor_runs_once_per_group():
    p1, p2 = ScaleEvenTokens(), ScaleEvenTokens()
    specs = [{"logits_processor": p1}, {}, {"logits_processor": p2}, {"logits_processor": p1}, {"logits_processor": p1}]
    b = _batch(specs)
    out = Sampler().sample(_logits(b), b, torch.arange(5))
    assert (p1.calls, p2.calls) == (1, 1)
    for i in range(5):
        a = SamplingBatch.from_requests([b.requests[i]], V)
        one = Sampler().sample(_logits(a), a, torch.tensor([i]))
        assert torch.equal(one.token_ids, out.token_ids[i : i + 1])
        assert torch.equal(one.logprobs, out.logprobs[i : i + 1])


def test_switching_batches_rebuilds_state():
    rec = Recorder()
    s = Sampler(processors=(rec,))
    a, b = _batch([{}, {}, {}]), _batch([{}, {}], start=7)
    s.sample(_logits(a), a, torch.zeros(3, dtype=torch.int64))
    s.sample(_logits(b), b, torch.zeros(2, dtype=torch.int64))
    assert rec.slots == [7, 8]
    assert rec.updates[-1].removed == (0, 1, 2)


class BadShape(LogitsProcessor):
    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        pass

    def apply(self, logits):
        return logits[:, :-1]


def test_processor_returning_wrong_shape_is_named():
    b = _batch([{}])
    with pytest.raises(InvalidSamplingParams, match="BadShape"):
        Sampler(processors=(BadShape(),)).sample(_logits(b), b, torch.zeros(1, dtype=torch.int64))


def test_non_processor_rejected():
    with pytest.raises(InvalidSamplingParams, match="LogitsProcessor"):
        Sampler(processors=(lambda x: x,))


def test_slot_helper_matches_reference_application():
    rec = Recorder()
    b = _batch([{}, {}, {}, {}])
    rec.update_state(b.update_since([]))
    upd = b.filter([3, 0, 2])
    rec.update_state(upd)
    assert rec.slots == apply_to_slots([0, 1, 2, 3], upd, None) == [3, 0, 2]


def test_docs_user_processor_example_runs():
    """The example of docs/sampling-penalties.md must keep working."""
    import pathlib
    import re

    doc = pathlib.Path(__file__).parents[2] / "docs" / "sampling-penalties.md"
    code = re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)[1]
    ns: dict = {}
    exec(code, ns)  # noqa: S102 - our own documentation
    b = SamplingBatch.from_requests(
        [
            Request("a", SamplingParams(seed=2, temperature=0.0), [1], [5]),
            Request("b", SamplingParams(seed=3, temperature=0.0), [1], [5]),
        ],
        10,
    )
    x = torch.zeros(2, 10)
    x[:, 5] = 1.0
    out = ns["sampler"].sample(x, b, torch.tensor([1, 1]))
    assert out.token_ids.tolist() == [0, 5]  # row a (even seed) may not repeat 5
