"""A request whose grammar is still compiling waits outside the batch, not inside sample().

Bugs pinned: one request's slow grammar compilation stalling every row of the batch
inside ``Sampler.sample`` (up to the compile timeout) instead of the request joining
when its grammar is ready, as SGLang's grammar queue does; a held request sampling other
tokens than if its grammar had been ready at once; ``grammar_ready`` waiting.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

from detsample import Request, SamplingBatch, SamplingParams
from detsample.refmodel import RefModel
from detsample.refmodel.engine import Engine, EngineConfig
from detsample.refmodel.schedule import Schedule
from detsample.refmodel.verify import result_diff
from detsample.vocab import Vocabulary

REGEX = r"[a-c]{2,6}x"


def gated_vocab(monkeypatch, gate: threading.Event) -> Vocabulary:
    """A default vocabulary whose compilations complete only once ``gate`` is set."""
    vocab = Vocabulary.default()
    comp = vocab.grammar_compiler
    real = comp.submit

    def submit(kind, text):
        inner, out = real(kind, text), cf.Future()

        def relay():
            gate.wait(60)
            out.set_result(inner.result())

        threading.Thread(target=relay, daemon=True).start()
        return out

    monkeypatch.setattr(comp, "submit", submit)
    return vocab


class OpensGate:
    """The reference model, setting ``gate`` at its ``n``-th forward call."""

    def __init__(self, gate: threading.Event, n: int) -> None:
        self.inner, self.gate, self.n, self.calls = RefModel(), gate, n, 0
        self.vocab_size, self.max_seq_len = self.inner.vocab_size, self.inner.max_seq_len

    def new_cache(self):
        return self.inner.new_cache()

    def forward(self, caches, chunks):
        self.calls += 1
        if self.calls == self.n:
            self.gate.set()
        return self.inner.forward(caches, chunks)


def _schedule():
    free = [Request(f"r{i}", SamplingParams(seed=i, max_new_tokens=10), [1 + i, 2, 3]) for i in range(2)]
    g = Request("g", SamplingParams(seed=7, regex=REGEX, max_new_tokens=8), [4, 5, 6])
    return Schedule.of([(0, free[0]), (0, g), (0, free[1])])


def test_a_compiling_grammar_is_held_out_and_joins_with_the_same_tokens(monkeypatch):
    gate = threading.Event()
    model = OpensGate(gate, n=5)
    cfg = EngineConfig(vocab=gated_vocab(monkeypatch, gate), hold_compiling_grammars=True)
    res = Engine(model, config=cfg).run(_schedule())
    joined = next(i for i, rids in enumerate(res.steps) if "g" in rids)
    assert joined >= 4  # the other rows sampled meanwhile: no step waited for the grammar
    assert all({"r0", "r1"} <= set(rids) for rids in res.steps[:joined])
    ready = Engine(RefModel(), config=EngineConfig(vocab=Vocabulary.default())).run(_schedule())
    assert res["g"].finish_reason != "grammar_error"
    for rid in ready.results:
        assert result_diff(ready[rid], res[rid]) is None


def test_grammar_ready_names_the_rows_still_compiling_without_waiting(monkeypatch):
    gate = threading.Event()
    vocab = gated_vocab(monkeypatch, gate)
    reqs = [Request("free", SamplingParams(seed=1), [1]), Request("g", SamplingParams(seed=2, regex=REGEX), [1])]
    batch = SamplingBatch.from_requests(reqs, 512, vocab=vocab)
    assert batch.grammar_ready() == [True, False]
    gate.set()
    batch.grammars[1].future.result(timeout=30)
    assert batch.grammar_ready() == [True, True]


@pytest.mark.parametrize("max_batch", [None, 1])
def test_a_lone_held_row_joins_at_once(max_batch):
    """With nothing else to run, the row joins and its sample waits for the grammar."""
    sched = Schedule.of([(0, Request("g", SamplingParams(seed=3, regex=REGEX), [1, 2]))])
    cfg = EngineConfig(max_batch_size=max_batch, hold_compiling_grammars=True)
    res = Engine(RefModel(), config=cfg).run(sched)
    assert res["g"].finish_reason == "grammar_terminated" and res.steps[0] == ("g",)
