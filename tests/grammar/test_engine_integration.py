"""Grammar rows through the reference engine (detsample/grammar/batching.py hooks in a
continuous-batching loop).

Bugs pinned: a grammar request's text or logprobs depending on when it arrived or who it
was batched with; sampling-time logprobs under a grammar mask differing from one-prefill
rescoring (the grammar state must be replayed from the request's output); a grammar row
not finishing when its grammar terminates.
"""

import json
import re

import jsonschema
import pytest
import torch

from detsample import Request, Sampler, SamplingParams, Vocabulary
from detsample.grammar.batching import FINISH_GRAMMAR_TERMINATED
from detsample.refmodel import RefModel, RefModelConfig
from detsample.refmodel.engine import Engine, EngineConfig, rescore
from detsample.refmodel.schedule import Schedule

SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
    "required": ["id", "ok"],
}
REGEX = r"(yes|no)-[0-9]{2}"
REQUESTS = [
    ("json", dict(json_schema=SCHEMA, logprobs_mode="scaled")),
    ("regex", dict(regex=REGEX, logprobs_mode="processed", temperature=0.8)),
    ("free", dict(max_new_tokens=6)),
    ("json-greedy", dict(json_schema=SCHEMA, temperature=0.0, logprobs_mode="scaled")),
]
SCHEDULES = [[0, 0, 0, 0], [0, 2, 1, 3], [3, 0, 2, 1]]


@pytest.fixture(scope="module")
def setup():
    model = RefModel(RefModelConfig())
    vocab = Vocabulary.default()
    engine = Engine(model, config=EngineConfig(vocab=vocab, default_max_new_tokens=60))
    return model, vocab, engine


def requests():
    return [Request(rid, SamplingParams(seed=i + 1, **kw), [1 + i, 2, 3]) for i, (rid, kw) in enumerate(REQUESTS)]


def _valid(rid, text):
    if rid.startswith("json"):
        jsonschema.validate(json.loads(text), SCHEMA)
    elif rid == "regex":
        assert re.fullmatch(REGEX, text.decode())


@pytest.mark.parametrize("arrivals", SCHEDULES)
def test_engine_grammar_rows_valid_and_schedule_invariant(setup, arrivals):
    model, vocab, engine = setup
    solo = {r.rid: engine.run(Schedule.of([(0, r)]))[r.rid] for r in requests()}
    mixed = engine.run(Schedule.of(list(zip(arrivals, requests()))))
    for r in requests():
        a, b = mixed[r.rid], solo[r.rid]
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        mode = r.params.logprobs_mode
        assert torch.equal(a.logprobs[mode], b.logprobs[mode])
        if r.params.grammar is not None:
            assert a.finish_reason == FINISH_GRAMMAR_TERMINATED and a.token_ids[-1] == 0
            _valid(r.rid, vocab.decode(a.token_ids))


def test_engine_grammar_logprobs_equal_rescore(setup):
    model, vocab, engine = setup
    res = engine.run(Schedule.of([(i, r) for i, r in enumerate(requests())]))
    for r in requests():
        out = res[r.rid]
        lp = rescore(model, Sampler(), r.params, r.prompt_ids, out.token_ids, vocab=vocab)
        assert torch.equal(lp, out.logprobs[r.params.logprobs_mode]), r.rid
