"""Tests of the cheap grammar step end to end (detsample/grammar/masker.py masked_step and
prefetch, Sampler.prefetch_grammar, the Sampler's draw of plain grammar rows over their
allowed columns): bitwise the same outputs as the plain select with re-sanitising and
the full-vocabulary draw, with and without a background bitmask fill.

Pins a prefetched bitmask used for a matcher that changed after the fill started
(another token, a rollback, a merge's fork), a prefetch racing a matcher update, and
the sampler trusting mask maxima where a penalty or a bias may have overflowed.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import Request, Sampler, SamplingBatch, SamplingParams, Vocabulary
from detsample.sampling import keptset
from tests.helpers import params_strategy

from .conftest import grammar_requests, random_session, same_steps

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "n": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "n", "tags"],
}


def _requests(tag: str, mix: str):
    """``mix``: "all" (penalties and a bias: the sampler re-sanitises), "bias" (a bias
    after the mask), "mask" (the mask alone changes the logits: its maxima are used)."""
    mk = SamplingParams
    reqs = [
        Request(f"{tag}s", mk(seed=1, json_schema=SCHEMA, logprobs_mode="scaled"), prompt_ids=[1]),
        Request(f"{tag}f", mk(seed=2), prompt_ids=[1]),  # a free row
        Request(f"{tag}g", mk(seed=5, json_schema=SCHEMA, temperature=0.0, logprobs_mode="scaled"), prompt_ids=[1]),
        Request(
            f"{tag}r",
            mk(seed=6, regex="[a-z]{2,9}( [0-9]{1,3})?", top_k=20, logprobs=3, logprobs_mode="processed"),
            prompt_ids=[1],
        ),
    ]
    if mix in ("all", "bias"):  # allowed tokens raised: the maximum moves
        reqs.append(
            Request(
                f"{tag}b",
                mk(seed=3, json_schema=SCHEMA, logprobs_mode="scaled", logit_bias={ord(c) + 1: 4.0 for c in 'a{"1,'}),
                prompt_ids=[1],
            )
        )
    if mix == "all":
        reqs.append(
            Request(
                f"{tag}p",
                mk(seed=4, regex="[a-z]{2,9}", repetition_penalty=1.3, logprobs_mode="processed"),
                prompt_ids=[1],
            )
        )
    return reqs


def _run(vocab, mix, *, reference: bool, prefetch: bool, steps: int = 24):
    """A scripted session: sample, advance, (prefetch), and now and then a filter,
    merge or rollback before the next sample. Returns every step's outputs."""
    sampler = Sampler()
    if reference:  # the plain select into a scratch buffer, then a full re-sanitise
        sampler.grammar_masker.buffer.supports = lambda logits: False
    batch = SamplingBatch.from_requests(_requests("a", mix), vocab_size=vocab.vocab_size, vocab=vocab)
    gen = torch.Generator().manual_seed(11)
    seen = []
    for step in range(steps):
        logits = torch.randn(len(batch), vocab.vocab_size, generator=gen) * 2.0
        pos = torch.tensor([len(o) for o in batch.output_ids])
        out = sampler.sample(logits, batch, pos)
        seen.append(
            (
                out.token_ids.clone(),
                out.logprobs.clone(),
                out.status.clone(),
                None if out.top_logprobs is None else out.top_logprobs[0].clone(),
            )
        )
        batch.advance(out.token_ids)
        if prefetch:
            sampler.prefetch_grammar(batch)
        if step % 9 == 4:  # a rollback after the prefetch started: the row is stale
            g = next(g for g in batch.grammars if g is not None and g.is_active and len(g.accepted) > 1)
            g.rollback(1)
            i = batch.grammars.index(g)
            batch.output_ids[i].pop()
        done = [i for i, f in enumerate(batch.finished) if f is not None]
        if done or step % 7 == 6:  # retire finished rows, add a fresh batch (forked)
            batch.filter([i for i in range(len(batch)) if i not in done][::-1])
            batch.merge(
                SamplingBatch.from_requests(_requests(f"n{step}_", mix), vocab_size=vocab.vocab_size, vocab=vocab)
            )
    return seen


@pytest.mark.parametrize("mix,prefetch", [("all", True), ("bias", False), ("mask", True)])
def test_cheap_mask_step_is_bitwise_the_reference(vocab, mix, prefetch):
    """Token ids, logprobs, top logprobs and status: bit for bit the plain select with
    re-sanitising, with and without the background fill."""
    ref = _run(vocab, mix, reference=True, prefetch=False)
    same_steps(_run(vocab, mix, reference=False, prefetch=prefetch), ref)


def test_prefetch_waits_before_the_matcher_changes(vocab):
    """accept_token, rollback and fork wait for an in-flight fill of their matcher."""
    batch = SamplingBatch.from_requests(_requests("w", "all"), vocab_size=vocab.vocab_size, vocab=vocab)
    sampler = Sampler()
    out = sampler.sample(torch.zeros(len(batch), vocab.vocab_size), batch, torch.zeros(len(batch), dtype=torch.long))
    batch.advance(out.token_ids)
    assert sampler.prefetch_grammar(batch) == 5  # the five grammar rows
    g = batch.grammars[0]
    fut = g._prefetch[0]
    g.rollback(1)
    assert fut.done() and g.take_prefetched() is None  # stale after the change
    sampler.grammar_masker.close()


GRAMMARS = [
    None,
    ("json_schema", SCHEMA),
    ("json_schema", {"type": "array", "items": {"type": "integer"}}),
    ("regex", "[a-z]{2,9}( [0-9]{1,3})?"),
    ("regex", "[0-9]{1,6}"),
]
_VOCAB = []


def _default_vocab():
    if not _VOCAB:
        _VOCAB.append(Vocabulary.default())
    return _VOCAB[0]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(params_strategy(512), st.sampled_from(range(len(GRAMMARS))), st.booleans()), min_size=1, max_size=6
    ),
    st.sampled_from(["random", "peaked", "ties", "neginf", "nan", "huge", "mixed"]),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0.25, 1.0]),
)
def test_column_draw_is_bitwise_the_full_pass(rows, family, seed, most):
    """Property: a session of grammar and free rows with any sampling parameters (plain
    rows with min-p and temperatures, filtered, greedy, biased rows, every logprobs mode
    and top logprobs) gives the same token ids, logprobs, top logprobs, status and
    ``compute_logprobs`` bit for bit whether plain grammar rows are drawn over their
    allowed columns or over the whole vocabulary (``most`` 1.0: dense select rows too)."""
    vocab = _default_vocab()
    assert vocab.vocab_size == 512
    # plain: no top-k / top-p, the rows drawn over their columns
    reqs = grammar_requests([(p.replace(top_k=-1, top_p=1.0) if plain else p, g) for p, g, plain in rows], GRAMMARS)
    fast, full = Sampler(), Sampler()
    full._by_columns = lambda plan, prep: None  # the full-vocabulary draw
    got, ref, used = [], [], []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(keptset, "COLUMN_DRAW_MAX", most)
        for sampler, seen in ((fast, got), (full, ref)):
            batch = SamplingBatch.from_requests(reqs, vocab_size=512, vocab=vocab)
            if sampler is fast:
                by_columns = sampler._by_columns
                sampler._by_columns = lambda plan, prep: used.append(by_columns(plan, prep)) or used[-1]
            seen.extend(random_session(sampler, batch, 512, seed, family, 6, rescore=True))
    same_steps(got, ref)
    if family not in ("mixed", "neginf") and any(  # (no row without a finite allowed logit)
        GRAMMARS[g] is not None and p.temperature > 0 and (plain or (p.top_k in (-1, 517) and p.top_p == 1.0))
        for p, g, plain in rows
    ):
        assert any(u is not None for u in used)  # the column draw did run
