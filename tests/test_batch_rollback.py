"""SamplingBatch.rollback: undoing advances leaves a row exactly as if they never happened.

Bugs pinned: a rejected draft token left in a row's output ids, penalty counts (a
token's slot surviving with count 0 keeps the repetition penalty on it), grammar matcher
or finish state, so that the next draw differs from the plain run's; rollback across
filter / merge losing track of which row advanced what; a bad step count silently
clamped.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample import InvalidSamplingParams, Request, Sampler, SamplingBatch, SamplingParams
from detsample.vocab import Vocabulary
from tests.helpers import row_bits_equal, sample_alone

V = 512
REGEX = r"[a-c]{1,6}x"
FAMILIES = {
    "plain": dict(temperature=1.0),
    "greedy": dict(temperature=0.0),
    "penalties": dict(temperature=0.9, repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3),
    "rep_only": dict(temperature=0.8, repetition_penalty=2.0),
    "min_tokens": dict(temperature=1.0, min_new_tokens=3, stop_token_ids=(7,)),
    "regex": dict(temperature=1.0, regex=REGEX),
    "regex_pen": dict(temperature=0.7, regex=REGEX, frequency_penalty=1.0, top_k=20),
}


@pytest.fixture(scope="module")
def vocab():
    return Vocabulary.default()


def _requests(families, seeds):
    return [
        Request(f"r{i}", SamplingParams(seed=s, **FAMILIES[f]), prompt_ids=[3, 5, 7, 5])
        for i, (f, s) in enumerate(zip(families, seeds))
    ]


def _logits(rng, B):
    x = rng.standard_normal((B, V)).astype(np.float32) * 2
    x[:, [97, 98, 99, 120, 0, 5, 7]] += 3.0  # a, b, c, x, EOS and prompt ids: often drawn
    return torch.from_numpy(x)


def _state(batch, i):
    pen = batch.penalties.rows[i] if batch.penalties is not None else None
    g = batch.grammars[i]
    return (
        list(batch.output_ids[i]),
        batch.finished[i],
        None if pen is None else (pen.n, pen.cols[: pen.n].tolist(), pen.snapshot()),
        None if g is None else (g.resolve(), list(g.accepted)),
    )


@given(
    families=st.lists(st.sampled_from(sorted(FAMILIES)), min_size=1, max_size=5),
    seed=st.integers(0, 2**31 - 1),
    steps=st.integers(1, 5),
    data=st.data(),
)
def test_rollback_equals_never_advancing(vocab, families, seed, steps, data):
    rng = np.random.default_rng(seed)
    reqs = _requests(families, [seed + i for i in range(len(families))])
    sampler = Sampler()
    batch = SamplingBatch.from_requests(reqs, V, vocab=vocab)
    drawn = []
    for j in range(steps):
        out = sampler.sample(_logits(rng, len(reqs)), batch, torch.full((len(reqs),), 4 + j))
        drawn.append(out.token_ids.tolist())
        batch.advance(out.token_ids)
    back = [data.draw(st.integers(0, steps)) for _ in reqs]
    batch.rollback(back)
    logits = _logits(rng, len(reqs))
    pos = torch.full((len(reqs),), 9)
    after = sampler.sample(logits, batch, pos)
    for i, r in enumerate(reqs):  # the row alone, advanced by the kept draws only
        alone = SamplingBatch.from_requests([r], V, vocab=vocab)
        for j in range(steps - back[i]):
            alone.advance([drawn[j][i]])
        assert _state(batch, i) == _state(alone, 0)
        ref = sampler.sample(logits[i : i + 1].clone(), alone, pos[i : i + 1])
        assert row_bits_equal(after, i, ref)


def test_rollback_drops_a_repetition_slot_the_prompt_did_not_hold(vocab):
    """The bug: an output-only token's slot kept with count 0 still gets the repetition
    penalty, so the next draw differs."""
    r = Request("a", SamplingParams(temperature=0.0, repetition_penalty=3.0, seed=1), [1, 2])
    batch = SamplingBatch.from_requests([r], V)
    batch.advance([40])
    batch.rollback([1])
    logits = torch.zeros((1, V))
    logits[0, 40] = 1.0  # the penalised slot would lose the argmax to token 0
    assert int(Sampler().sample(logits, batch, torch.tensor([2])).token_ids[0]) == 40
    assert batch.penalties.rows[0].snapshot() == {1: 0, 2: 0}


def test_rollback_restores_a_terminated_grammar_and_the_finish_state(vocab):
    r = Request("g", SamplingParams(temperature=1.0, regex="ab", seed=3), [1])
    batch = SamplingBatch.from_requests([r], V, vocab=vocab)
    for t in vocab.encode(b"ab"):
        batch.advance([t])
    if batch.finished[0] is None:
        batch.advance([vocab.eos_token_ids[0]])
    assert batch.finished[0] == "grammar_terminated"
    n = len(batch.journal[0])
    batch.rollback([n])
    assert batch.finished[0] is None and batch.output_ids[0] == []
    assert batch.grammars[0].state == "active" and batch.grammars[0].accepted == []


def test_rollback_follows_rows_through_filter_and_merge(vocab):
    reqs = _requests(["penalties", "plain", "regex"], [1, 2, 3])
    a = SamplingBatch.from_requests(reqs[:2], V, vocab=vocab)
    b = SamplingBatch.from_requests(reqs[2:], V, vocab=vocab)
    a.advance([5, 6])
    b.advance([vocab.encode(b"a")[0]])
    a.merge(b)
    a.filter([2, 0])
    a.advance([vocab.encode(b"b")[0], 9])
    a.rollback([1, 2])
    assert a.output_ids == [vocab.encode(b"a"), []]
    assert a.penalties.rows[1].snapshot() == {3: 0, 5: 0, 7: 0}
    assert a.grammars[0].accepted == vocab.encode(b"a")


@pytest.mark.parametrize(
    "steps, match",
    [
        ([1], "steps has 1 entries for a batch of 2 rows"),
        ([0, 2], r"row 1 steps must be in \[0, 1\], got 2"),
        ([-1, 0], r"row 0 steps must be in \[0, 1\], got -1"),
        ([0.5, 0], "steps"),
    ],
)
def test_rollback_refuses_bad_counts_and_changes_nothing(steps, match):
    reqs = _requests(["penalties", "plain"], [1, 2])
    batch = SamplingBatch.from_requests(reqs, V)
    batch.advance([5, 6])
    with pytest.raises(InvalidSamplingParams, match=match):
        batch.rollback(steps)
    assert batch.output_ids == [[5], [6]]


def test_sample_alone_helper_agrees_with_a_rolled_back_row(vocab):
    """A row rolled back to nothing samples as the fresh request does."""
    r = _requests(["penalties"], [11])[0]
    batch = SamplingBatch.from_requests([r], V)
    batch.advance([5])
    batch.advance([40])
    batch.rollback([2])
    logits = _logits(np.random.default_rng(0), 1)
    out = Sampler().sample(logits.clone(), batch, torch.tensor([3]))
    assert row_bits_equal(out, 0, sample_alone(Sampler(), logits[0], r, 3, V))
