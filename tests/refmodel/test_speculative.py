"""Speculative decoding changes no bit: a speculative run's tokens, logprobs, top logprobs,
finish reasons and seeds equal the plain run's, for any proposer, k and schedule.

Bugs pinned: a draft accepted because it is likely rather than because it is the
target's own draw (the run then follows the target distribution but not the plain
run's tokens); a rejected draft's penalty count, grammar token or finish state left in
the batch; a draw at the wrong position (the seed stream shifted by the drafts); the
cache keeping rejected drafts; max_new_tokens / max_seq_len checked on the drafted cache
instead of the plain run's; a proposer's bad answer silently used. Negative control: a
target whose chunked forward is not bitwise its decode (a verification forward that is
not batch-invariant) breaks equality, and the comparison sees it.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import InvalidSamplingParams, Request, SamplingParams
from detsample.refmodel import RefModel, RefModelConfig
from detsample.refmodel.engine import Engine, EngineConfig
from detsample.refmodel.schedule import Schedule
from detsample.refmodel.speculative import DraftModel, DraftRow, NGram, Speculative
from detsample.refmodel.verify import result_diff
from tests.refmodel.test_engine import PARAMS, make_request


class RandomProposer:
    """Drafts that rarely agree: seeded random ids."""

    def __init__(self, seed: int = 0, vocab_size: int = 512) -> None:
        self.rng, self.V = random.Random(seed), vocab_size

    def propose(self, rows):
        return [[self.rng.randrange(self.V) for _ in range(r.limit)] for r in rows]


class OracleProposer:
    """Drafts the plain run's own tokens: every draft must be accepted."""

    def __init__(self, plain) -> None:
        self.plain = plain

    def propose(self, rows):
        out = []
        for r in rows:
            toks = self.plain[r.request.rid].token_ids
            n = len(r.generated)
            out.append(list(toks[n : n + r.limit]))
        return out


class ChunkDrift:
    """A target whose chunked forward on a non-empty cache is one ULP off its decode:
    the verification forward is not batch-invariant (the negative control)."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, "chunk-drift"
        self.vocab_size, self.max_seq_len = inner.vocab_size, inner.max_seq_len

    def new_cache(self):
        return self.inner.new_cache()

    def forward(self, caches, chunks):
        held = [len(c) for c in caches]
        outs = self.inner.forward(caches, chunks)
        return [
            torch.nextafter(o, torch.full_like(o, float("inf"))) if h and len(c) > 1 else o
            for o, h, c in zip(outs, held, chunks)
        ]


def _schedule(families, seeds, max_new=8, stagger=1):
    reqs = [
        make_request(f"{f}{i}", f, seed=s, max_new=max_new, prompt_len=3 + (s % 7))
        for i, (f, s) in enumerate(zip(families, seeds))
    ]
    return Schedule.of([(i * stagger % 4, r) for i, r in enumerate(reqs)])


def _assert_same(plain, spec):
    assert set(plain.results) == set(spec.results)
    diffs = [d for d in (result_diff(plain[r], spec[r]) for r in plain.results) if d is not None]
    assert diffs == [], str(diffs[0])


FAMILIES = sorted(PARAMS)
MIXED = _schedule(FAMILIES, range(len(FAMILIES)), max_new=10)


@pytest.fixture(scope="module")
def plain(model):
    return Engine(model, config=EngineConfig(max_batch_size=5)).run(MIXED)


@pytest.mark.parametrize("proposer", ["ngram", "same_model", "other_model", "random"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_speculative_run_equals_the_plain_run(model, plain, proposer, k):
    prop = {
        "ngram": lambda: NGram(max_n=2),
        "same_model": lambda: DraftModel(model),
        "other_model": lambda: DraftModel(RefModel(RefModelConfig(seed=7))),
        "random": lambda: RandomProposer(k),
    }[proposer]()
    spec = Engine(model, config=EngineConfig(max_batch_size=5), speculative=Speculative(prop, k)).run(MIXED)
    _assert_same(plain, spec)
    s = spec.speculative
    assert s.emitted == sum(len(r.token_ids) for r in plain.results.values()) + sum(
        r.finish_reason == "no_valid_token" for r in plain.results.values()
    )
    if proposer == "same_model":
        assert s.acceptance_rate > 0.9 and s.steps < len(plain.steps)


def test_a_stop_test_ends_the_speculative_run_at_the_plain_runs_token(model, plain):
    """A speculative step accepts several tokens at once: each is asked in turn, so the
    request ends at the same token as the plain run, drafts past it discarded."""

    def stop_after(request, ids):
        return len(ids) >= 3 and ids[-1] % 3 == 0

    one = Engine(model, config=EngineConfig(max_batch_size=5)).run(MIXED, stop_after=stop_after)
    spec = Engine(model, config=EngineConfig(max_batch_size=5), speculative=Speculative(DraftModel(model), 3)).run(
        MIXED, stop_after=stop_after
    )
    _assert_same(one, spec)
    assert any(
        r.finish_reason == "stop" and len(r.token_ids) < len(plain[rid].token_ids) for rid, r in one.results.items()
    )


def test_drafts_that_are_the_plain_runs_tokens_are_all_accepted(model, plain):
    spec = Engine(model, config=EngineConfig(max_batch_size=5), speculative=Speculative(OracleProposer(plain), 3)).run(
        MIXED
    )
    _assert_same(plain, spec)
    assert spec.speculative.acceptance_rate == 1.0 and spec.speculative.proposed > 0


@settings(max_examples=8)
@given(
    families=st.lists(st.sampled_from(FAMILIES), min_size=1, max_size=4),
    seed=st.integers(0, 2**20),
    k=st.integers(1, 5),
    proposer=st.sampled_from(["ngram", "same_model", "random"]),
    chunk=st.sampled_from([None, 3]),
    batch=st.sampled_from([None, 2]),
)
def test_speculative_equals_plain_for_any_parameters(model, families, seed, k, proposer, chunk, batch):
    sched = _schedule(families, [seed + i for i in range(len(families))], max_new=6)
    cfg = EngineConfig(max_batch_size=batch, prefill_chunk=chunk, extra_logprobs_modes=("processed",))
    prop = {"ngram": NGram(), "same_model": DraftModel(model), "random": RandomProposer(seed)}[proposer]
    _assert_same(
        Engine(model, config=cfg).run(sched), Engine(model, config=cfg, speculative=Speculative(prop, k)).run(sched)
    )


def test_max_seq_len_is_checked_on_the_plain_runs_cache():
    m = RefModel(RefModelConfig(max_seq_len=20))
    reqs = [(0, Request(f"r{n}", SamplingParams(seed=n, max_new_tokens=30), list(range(1, n)))) for n in (10, 14, 17)]
    sched = Schedule.of(reqs)
    plain = Engine(m).run(sched)
    assert {r.finish_reason for r in plain.results.values()} >= {"max_seq_len"}
    _assert_same(plain, Engine(m, speculative=Speculative(DraftModel(m), 4)).run(sched))


def test_a_verification_forward_that_is_not_batch_invariant_breaks_equality(model, plain):
    """Negative control: the same engine and drafts over a target whose chunked forward
    drifts by one ULP gives other logprobs than its plain (decode-only) run."""
    drift = ChunkDrift(model)
    base = Engine(drift, config=EngineConfig(max_batch_size=5)).run(MIXED)
    spec = Engine(drift, config=EngineConfig(max_batch_size=5), speculative=Speculative(DraftModel(model), 3)).run(
        MIXED
    )
    diffs = [result_diff(base[r], spec[r]) for r in base.results]
    assert any(d is not None for d in diffs)


class _NoTruncate:
    def __init__(self, inner):
        self.inner, self.vocab_size, self.max_seq_len, self.name = (
            inner,
            inner.vocab_size,
            inner.max_seq_len,
            "plain-cache",
        )

    def new_cache(self):
        return object()

    def forward(self, caches, chunks):
        raise AssertionError("never called")


class _BadProposer:
    def __init__(self, answer):
        self.answer = answer

    def propose(self, rows):
        return self.answer(rows)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda m: Speculative(NGram(), 0), "num_speculative_tokens must be an int >= 1, got 0"),
        (lambda m: Speculative(object(), 2), "proposer must have a propose"),
        (lambda m: NGram(max_n=1, min_n=2), "min_n must be <= max_n"),
        (lambda m: Engine(_NoTruncate(m), speculative=Speculative(NGram(), 2)), "needs caches with truncate"),
    ],
)
def test_bad_speculative_setups_are_refused(model, make, match):
    with pytest.raises(InvalidSamplingParams, match=match):
        make(model)


@pytest.mark.parametrize(
    "answer, match",
    [
        (lambda rows: [[1] * (r.limit + 1) for r in rows], "more than its limit"),
        (lambda rows: [[600] if r.limit else [] for r in rows], "draft token 600 outside"),
        (lambda rows: [], "returned 0 draft lists"),
    ],
)
def test_a_proposers_bad_answer_is_refused(model, answer, match):
    sched = _schedule(["plain", "greedy"], [1, 2])
    with pytest.raises(InvalidSamplingParams, match=match):
        Engine(model, speculative=Speculative(_BadProposer(answer), 2)).run(sched)


def test_ngram_proposes_what_followed_the_last_occurrence():
    row = DraftRow(Request("a", SamplingParams(seed=0), [1]), (5, 6, 7, 9, 5, 6), (), 3)
    assert NGram(max_n=2).propose([row]) == [[7, 9, 5]]
    assert NGram().propose([DraftRow(row.request, (1, 2, 3), (), 3)]) == [[]]


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_hf_model_speculative_equals_plain_only_under_the_mode(batch_invariant):
    """Under the batch-invariant mode the verification chunk gives each position its
    decode bits, so the speculative run is the plain run; on torch's default kernels it is
    not (the natural negative control: a chunk of 3 tokens rounds otherwise than 1)."""
    from detsample.models import load_model
    from tests.refmodel.test_engine_models import _schedule as hf_schedule

    lm = load_model("hf-tiny-llama", batch_invariant=batch_invariant)
    sched, cfg = hf_schedule(max_new=5), EngineConfig(max_batch_size=3)
    plain = Engine(lm, config=cfg).run(sched)
    spec = Engine(lm, config=cfg, speculative=Speculative(DraftModel(lm), 2)).run(sched)
    diffs = [d for d in (result_diff(plain[r], spec[r]) for r in plain.results) if d is not None]
    assert spec.speculative.accepted > 0
    if batch_invariant:
        assert diffs == [], str(diffs[0])
    else:
        assert diffs, "default kernels gave the plain run's bits: the control proves nothing"


def test_require_reasoning_rows_equal_the_plain_run_across_the_end_token(model):
    """The end-of-thinking token (here the second token a free run draws) wakes the
    grammar inside a verification; a rejected position after it rolls it back."""
    free = Request("free", SamplingParams(seed=5, max_new_tokens=8), [3, 4, 5])
    think_end = Engine(model).run(Schedule.of([(0, free)]))["free"].token_ids[1]
    cfg = EngineConfig(think_end_token_id=think_end, max_batch_size=3)
    reqs = [
        Request(
            "think", SamplingParams(seed=5, max_new_tokens=8, regex="[a-c]{2,4}x", require_reasoning=True), [3, 4, 5]
        ),
        make_request("other", "penalties", seed=2),
    ]
    sched = Schedule.of([(0, r) for r in reqs])
    plain = Engine(model, config=cfg).run(sched)
    assert plain["think"].token_ids[:2] == Engine(model).run(Schedule.of([(0, free)]))["free"].token_ids[:2]
    for prop in (DraftModel(model, think_end_token_id=think_end), RandomProposer(3)):
        _assert_same(plain, Engine(model, config=cfg, speculative=Speculative(prop, 3)).run(sched))
