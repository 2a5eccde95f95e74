"""require_reasoning: the grammar of a request starts after its end-of-thinking token.

Bugs pinned: a reasoning model's thinking masked by the answer's grammar (SGLang's
``require_reasoning``); the end-of-thinking token fed to the matcher; a resumed request
whose output already holds the end token starting the grammar at the wrong place; a
speculative rollback across the end token leaving the grammar awake; a request asking
for it without a configured end token accepted silently.
"""

from __future__ import annotations

import pytest
import torch

from detsample import InvalidSamplingParams, Request, Sampler, SamplingBatch, SamplingParams
from detsample.vocab import Vocabulary

THINK_END = 300
REGEX = "[a-c]{2,4}x"
Z, A = ord("z") + 1, ord("a") + 1  # byte tokens sit at id byte + 1 in the default vocabulary


@pytest.fixture(scope="module")
def vocab():
    return Vocabulary.default()


def _batch(vocab, output_ids=(), think_end=THINK_END):
    r = Request("r", SamplingParams(seed=1, regex=REGEX, require_reasoning=True), [1], list(output_ids))
    return SamplingBatch.from_requests([r], 512, vocab=vocab, think_end_token_id=think_end)


def _favour(t):
    x = torch.zeros((1, 512))
    x[0, t] = 50.0
    return x


def _step(batch, t):
    out = Sampler().sample(_favour(t), batch, torch.tensor([5]))
    batch.advance(out.token_ids)
    return int(out.token_ids[0])


def test_reasoning_is_free_and_the_grammar_starts_after_the_end_token(vocab):
    assert vocab.tokens[Z] == b"z" and vocab.tokens[A] == b"a"
    batch = _batch(vocab)
    assert [_step(batch, Z), _step(batch, Z), _step(batch, THINK_END)] == [Z, Z, THINK_END]
    assert _step(batch, Z) != Z  # the grammar masks from here: only a, b or c
    g = batch.grammars[0]
    assert not g.dormant and g.accepted == batch.output_ids[0][3:]


def test_a_resumed_request_starts_its_grammar_after_the_end_token_it_holds(vocab):
    batch = _batch(vocab, output_ids=[Z, THINK_END, A])
    assert batch.grammars[0].resolve() == "active" and batch.grammars[0].accepted == [A]
    assert _step(batch, Z) != Z
    still = _batch(vocab, output_ids=[Z, Z])
    assert still.grammars[0].dormant and _step(still, Z) == Z


def test_rollback_across_the_end_token_puts_the_grammar_back_to_sleep(vocab):
    batch = _batch(vocab)
    for t in (Z, THINK_END, A):
        _step(batch, t)
    batch.rollback([2])
    assert batch.grammars[0].dormant and batch.output_ids == [[Z]]
    assert _step(batch, Z) == Z  # free again


def test_require_reasoning_without_an_end_token_is_refused(vocab):
    with pytest.raises(InvalidSamplingParams, match="require_reasoning needs the end-of-thinking"):
        _batch(vocab, think_end=None)
    with pytest.raises(InvalidSamplingParams, match=r"think_end_token_id must be in \[0, 512\)"):
        _batch(vocab, think_end=512)
    with pytest.raises(InvalidSamplingParams, match="require_reasoning must be a bool"):
        SamplingParams(require_reasoning=1)
