"""detsample/penalties.py (pipeline step 3 in the Sampler) and the batch state behind it.

Pins: step-3 order (additive, scaling, min_new_tokens, allowed, bad words), penalty
counts that lose or mix rows through filter/merge, state shared between merged batches,
a batch without penalties paying for (B, V) state, and batch-composition dependence of
any row's tokens or logprobs (each row must equal the same request run alone).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import InvalidSamplingParams, Request, Sampler, SamplingBatch, SamplingParams
from detsample.processors.builtin import MinPLogitsProcessor
from detsample.processors.penalties import apply_penalties_and_constraints
from detsample.processors.penalty_state import RowTokens
from oracles import penalties as orc
from tests.penalty_cases import EOS, LowerNonMax, PenalizeLastToken, V, logits_for, request_st


def _batch(reqs):
    return SamplingBatch.from_requests(reqs, V, eos_token_ids=EOS)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(*[request_st(i) for i in range(n)])), st.integers(0, 999))
def test_penalties_and_constraints_match_oracle_bitwise(reqs, seed):
    """Every row of step 3 equals the float32 oracle of that row alone."""
    batch = _batch(list(reqs))
    x = torch.randn((len(reqs), V), generator=torch.Generator().manual_seed(seed)) * 3
    got = apply_penalties_and_constraints(x, batch)
    assert torch.equal(x, torch.randn((len(reqs), V), generator=torch.Generator().manual_seed(seed)) * 3)
    for i, r in enumerate(reqs):
        want = orc.penalties_and_constraints_row(
            x[i].numpy(), r.params, r.prompt_ids, r.output_ids, EOS, dtype=np.float32
        )
        assert np.array_equal(got[i].numpy().view(np.int32), want.view(np.int32)), r


def test_min_new_tokens_lifts_after_enough_tokens():
    p = SamplingParams(temperature=0.0, min_new_tokens=2, stop_token_ids=(5,), seed=1)
    batch = _batch([Request("a", p, [1], [])])
    x = torch.zeros((1, V))
    x[0, 5] = 10.0
    x[0, 0] = 9.0
    s = Sampler()
    got = []
    for _ in range(3):
        t = s.sample(x, batch, torch.tensor([0])).token_ids
        got.append(int(t))
        batch.advance(t)
    assert got == [1, 1, 5]  # eos (0) and stop (5) blocked for two tokens


def test_order_additive_before_scaling():
    """(x - f) / r, not x / r - f: 4.0 with f=1, r=2 gives 1.5 (not 1.0)."""
    p = SamplingParams(frequency_penalty=1.0, repetition_penalty=2.0, seed=1)
    batch = _batch([Request("a", p, [], [3])])
    x = torch.zeros((1, V))
    x[0, 3] = 4.0
    got = apply_penalties_and_constraints(x, batch)
    assert float(got[0, 3]) == 1.5


def test_no_penalty_batch_allocates_nothing():
    """A batch where no row has a penalty holds no penalty state and no (.., V) tensor,
    and step 3 returns the logits object itself (no copy)."""
    reqs = [Request(f"r{i}", SamplingParams(seed=i, top_k=3), [1, 2], [3]) for i in range(4)]
    batch = _batch(reqs)
    batch.advance([1, 2, 3, 4])
    batch.filter([2, 0])
    batch.merge(_batch([Request("z", SamplingParams(seed=9), [4], [])]))
    assert batch.penalties is None
    big = [k for k, v in vars(batch).items() if isinstance(v, torch.Tensor) and V in v.shape]
    assert big == []
    x = torch.randn((len(batch), V))
    assert apply_penalties_and_constraints(x, batch) is x


def test_penalty_state_dropped_when_last_penalised_row_leaves():
    reqs = [
        Request("a", SamplingParams(presence_penalty=1.0, seed=1), [], []),
        Request("b", SamplingParams(seed=2), [], []),
    ]
    batch = _batch(reqs)
    assert batch.penalties is not None
    batch.filter([1])
    assert batch.penalties is None


def test_merge_copies_state_instead_of_sharing():
    """Advancing the merged batch must not change the source batch's counts."""
    a = _batch([Request("a", SamplingParams(frequency_penalty=1.0, seed=1), [], [2])])
    b = _batch([Request("b", SamplingParams(frequency_penalty=1.0, seed=2), [], [3])])
    a.merge(b)
    a.advance([5, 3])
    assert b.penalties.rows[0].snapshot() == {3: 1}
    assert a.penalties.rows[1].snapshot() == {3: 2}


BAD = [
    ("negative repetition", dict(repetition_penalty=-1.0), "repetition_penalty"),
    ("zero repetition", dict(repetition_penalty=0.0), "repetition_penalty"),
    ("float32-underflow repetition", dict(repetition_penalty=1e-50), "repetition_penalty"),
    ("float32-overflow frequency", dict(frequency_penalty=1e39), "frequency_penalty"),
    ("allowed id outside vocab", dict(allowed_token_ids=(1, V)), "allowed_token_ids"),
    ("bad word id outside vocab", dict(bad_words=((1, V + 3),)), "bad_words"),
    ("stop id outside vocab", dict(stop_token_ids=(V,)), "stop_token_ids"),
    ("processor not callable", dict(logits_processor=42), "logits_processor"),
]


@pytest.mark.parametrize("name,kw,field", BAD, ids=[b[0] for b in BAD])
def test_bad_values_name_the_field(name, kw, field):
    with pytest.raises(InvalidSamplingParams, match=field):
        _batch([Request("a", SamplingParams(seed=1, **kw), [1], [])])


# -- the composition property ---------------------------------------------------------
def _sampler():
    return Sampler(processors=(PenalizeLastToken(), MinPLogitsProcessor(), LowerNonMax()))


def _step(sampler, batch, record):
    rows = [logits_for(r.rid, len(o)) for r, o in zip(batch.requests, batch.output_ids)]
    x = torch.stack(rows) if rows else torch.empty((0, V))
    pos = torch.tensor(
        [len(r.prompt_ids) + len(o) for r, o in zip(batch.requests, batch.output_ids)], dtype=torch.int64
    )
    out = sampler.sample(x, batch, pos)
    for i, r in enumerate(batch.requests):
        record.setdefault(r.rid, []).append((int(out.token_ids[i]), out.logprobs[i].view(torch.int32).item()))
    batch.advance(out.token_ids)


def _check_rebuild(sampler, batch):
    """Penalty counts and processor slots equal a from-scratch rebuild."""
    for i, (r, o) in enumerate(zip(batch.requests, batch.output_ids)):
        row = batch.penalties.rows[i] if batch.penalties is not None else None
        if r.params.has_penalties:
            assert row.snapshot() == RowTokens(r.params, r.prompt_ids, o).snapshot()
        else:
            assert row is None
    sampler._runner.sync(batch)
    fresh = Sampler(processors=tuple(type(p)() for p in sampler.processors))
    fresh._runner.sync(batch)
    for got, want in zip(sampler.processors, fresh.processors):
        assert got.slots == want.slots
        for a, b in zip(got.slots, want.slots):  # live output refs, not copies
            if isinstance(a, tuple) and isinstance(a[-1], list):
                assert a[-1] is b[-1]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_rows_equal_alone_through_random_filter_merge(data):
    """Random advance / filter (any order, dropping rows) / merge / new batch: each
    request's tokens and logprobs equal, bitwise, the request run alone; penalty and
    processor state equal a rebuild after every operation."""
    n_req = data.draw(st.integers(3, 10))
    pool = [data.draw(request_st(i)) for i in range(n_req)]
    fresh = iter(pool)

    def take():
        return [r for r in (next(fresh, None) for _ in range(data.draw(st.integers(1, 3)))) if r is not None]

    live = [[_sampler(), _batch(take())]]
    record: dict[str, list] = {}
    for _ in range(data.draw(st.integers(4, 16))):
        op = data.draw(st.sampled_from(["step", "step", "filter", "merge", "new"]))
        k = data.draw(st.integers(0, len(live) - 1))
        sampler, batch = live[k]
        if op == "step":
            _step(sampler, batch, record)
        elif op == "filter" and len(batch):
            keep = data.draw(st.permutations(range(len(batch))))
            keep = keep[: data.draw(st.integers(0, len(keep)))]
            batch.filter(keep)
        elif op == "merge" and len(live) > 1:
            j = data.draw(st.sampled_from([i for i in range(len(live)) if i != k]))
            batch.merge(live[j][1])
            del live[j]
        elif op == "new":
            reqs = take()
            if reqs:
                live.append([_sampler(), _batch(reqs)])
        for s, b in live:
            _check_rebuild(s, b)
    for r in pool:
        steps = record.get(r.rid, [])
        alone = _batch([Request(r.rid, r.params, r.prompt_ids, r.output_ids)])
        s = _sampler()
        solo: dict[str, list] = {}
        for _ in steps:
            _step(s, alone, solo)
        assert solo.get(r.rid, []) == steps, r.rid


def test_constraints_leaving_no_token_mark_only_that_row():
    """allowed = {eos} while min_new_tokens blocks eos: row 0 has no admissible token
    (-1, status flag); its neighbour samples as if alone."""
    bad = SamplingParams(seed=1, allowed_token_ids=(0,), min_new_tokens=1)
    good = SamplingParams(seed=2)
    batch = _batch([Request("a", bad, [1], []), Request("b", good, [1], [])])
    x = torch.stack([logits_for("a", 0), logits_for("b", 0)])
    out = Sampler().sample(x, batch, torch.tensor([1, 1]))
    alone = _batch([Request("b", good, [1], [])])
    ref = Sampler().sample(x[1:], alone, torch.tensor([1]))
    assert int(out.token_ids[0]) == -1 and int(out.status[0]) & 4
    assert torch.equal(out.token_ids[1:], ref.token_ids)
    assert torch.equal(out.logprobs[1:], ref.logprobs)


def test_overflowing_penalty_is_sanitised_and_flagged():
    """A huge negative frequency penalty overflows a logit to +inf: step 2's rule
    (+inf -> largest float32, status bit 2) applies again after step 3."""
    p = SamplingParams(seed=1, temperature=0.0, frequency_penalty=-3e38)
    batch = _batch([Request("a", p, [], [7, 7])])
    x = torch.zeros((1, V))
    x[0, 7] = 3e38
    out = Sampler().sample(x, batch, torch.tensor([2]))
    assert int(out.token_ids[0]) == 7 and int(out.status[0]) & 2


def test_row_tokens_grow_past_initial_capacity():
    """Regression: counting a 17th distinct token grew the arrays while indexing the old
    one (IndexError inside batch.advance in a long engine run)."""
    row = RowTokens(SamplingParams(frequency_penalty=0.5), [], list(range(40)) + [3, 3])
    snap = row.snapshot()
    assert len(snap) == 40 and snap[3] == 3 and snap[39] == 1


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(*[request_st(i) for i in range(n)])))
def test_rescoring_path_sees_the_same_penalties_and_constraints(reqs):
    """compute_logprobs (prefill rescoring) equals the sampled logprobs bitwise for
    rows with penalties and constraints, in every logprobs_mode."""
    batch = _batch(list(reqs))
    x = torch.stack([logits_for(r.rid, len(r.output_ids)) for r in reqs])
    pos = torch.tensor([len(r.prompt_ids) + len(r.output_ids) for r in reqs])
    s = _sampler()
    out = s.sample(x, batch, pos)
    ok = out.token_ids >= 0
    lp = s.compute_logprobs(x, batch, out.token_ids.clamp(min=0))
    assert torch.equal(lp[ok].view(torch.int32), out.logprobs[ok].view(torch.int32))
