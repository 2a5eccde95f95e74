"""Engine: continuous batching is invisible to every request, and sampling-time logprobs
equal one-prefill rescoring bitwise.

Bugs pinned: a request's tokens or logprobs depending on its neighbours, arrival order,
batch splits, thread count or run (batch-composition leaks); the logprob an engine
reports at sampling time differing from what a trainer recomputes by prefill (vLLM's
``test_decode_logprobs_match_prefill_logprobs``, SGLang's ``p_vs_d``); requests not
stopping on EOS / stop ids / max_new_tokens / max_seq_len / no admissible token.
"""

from __future__ import annotations

import json
import random
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import InvalidSamplingParams, Request, Sampler, SamplingParams
from detsample.processors.base import LogitsProcessor
from detsample.refmodel import RefModel, RefModelConfig
from detsample.refmodel.engine import Engine, EngineConfig, RequestResult, rescore, with_mode
from detsample.refmodel.schedule import Schedule
from detsample.refmodel.verify import alignment_mismatches, float_bits, invariance_mismatches, result_diff
from detsample.vocab import Vocabulary
from tests.helpers import params_strategy

REGEX = r"[a-c]{2,5}x"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

PARAMS = {
    "plain": dict(temperature=1.0),
    "greedy": dict(temperature=0.0),
    "hot_topk": dict(temperature=1.3, top_k=40),
    "topp": dict(temperature=0.8, top_p=0.9),
    "minp": dict(temperature=0.9, min_p=0.05),
    "all_filters": dict(temperature=0.7, top_k=100, top_p=0.95, min_p=0.01),
    "bias": dict(temperature=1.0, logit_bias={5: 2.5, "33": -1.0}),
    "top3": dict(temperature=1.0, logprobs=3),
    # penalties and min_new_tokens count the request's own output (state replayed by rescore)
    "penalties": dict(temperature=0.9, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2),
    "min_tokens": dict(temperature=1.0, min_new_tokens=5, stop_token_ids=(7, 9)),
    # grammars (default vocabulary): the row finishes when the matcher accepts EOS
    "regex": dict(temperature=1.0, regex=REGEX),
    "json": dict(temperature=0.8, json_schema=SCHEMA),
}


def make_request(
    rid: str, family: str, seed: int, mode: str = "raw", max_new: int = 12, prompt_len: int = 6
) -> Request:
    rng = random.Random(seed)
    p = SamplingParams(seed=seed, max_new_tokens=max_new, logprobs_mode=mode, **PARAMS[family])
    return Request(rid, p, [rng.randrange(1, 512) for _ in range(prompt_len)])


def same_result(a: RequestResult, b: RequestResult) -> bool:
    d = result_diff(a, b)
    assert d is None, str(d)
    return True


def bits(t: torch.Tensor) -> torch.Tensor:
    return float_bits(t)


@pytest.fixture(scope="module")
def engine(model) -> Engine:
    return Engine(model)


def mixed_requests(mode: str = "raw") -> list[Request]:
    return [
        make_request(
            f"{fam}{i}", fam, seed=10 * i + j, mode=mode, max_new=8 + (i * 5 + j) % 9, prompt_len=3 + (7 * i + j) % 11
        )
        for j, fam in enumerate(PARAMS)
        for i in range(2)
    ]


def test_engine_outputs_shape(engine):
    reqs = mixed_requests()
    res = engine.run(Schedule.of([(i % 5, r) for i, r in enumerate(reqs)]))
    assert set(res.results) == {r.rid for r in reqs}
    for r in reqs:
        out = res[r.rid]
        assert 1 <= len(out.token_ids) <= r.params.max_new_tokens
        assert out.logprobs["raw"].dtype == torch.float32
        assert out.logprobs["raw"].shape == (len(out.token_ids),)
        assert out.seed == r.params.seed
        assert out.finish_reason in ("length", "eos", "stop", "grammar_terminated")
        last = out.token_ids[-1]
        assert (out.finish_reason in ("eos", "grammar_terminated")) == (last == 0)
        assert (out.finish_reason == "grammar_terminated") == (r.params.grammar is not None and last == 0)
        assert (out.finish_reason == "stop") == (last in r.params.stop_token_ids and last != 0)
        assert out.arrival_step <= out.finish_step
        if r.params.logprobs:
            vals, ids = out.top_logprobs
            assert vals.shape == ids.shape == (len(out.token_ids), 3)
            assert bool((vals[:, 0] >= out.logprobs["raw"]).all())
    assert max(len(s) for s in res.steps) > 8, "the schedule must actually batch"


@pytest.mark.parametrize("mode", ["raw", "scaled", "processed"])
def test_sampling_logprobs_equal_rescore(model, engine, mode):
    """Every generated position: engine logprob == one-prefill compute_logprobs, bitwise."""
    reqs = mixed_requests(mode)
    res = engine.run(Schedule.of([(i % 4, r) for i, r in enumerate(reqs)]))
    sampler = Sampler()
    for r in reqs:
        out = res[r.rid]
        lp = rescore(model, sampler, r.params, r.prompt_ids, out.token_ids)
        got = out.logprobs[mode]
        for t in range(len(out.token_ids)):
            assert torch.equal(bits(got[t]), bits(lp[t])), (r.rid, t, float(got[t]), float(lp[t]))
    assert alignment_mismatches(model, sampler, reqs, res) == []


def test_resumed_request_alignment(model, engine):
    """A request created with output_ids (resumed) continues after them; rescoring the
    whole output reproduces the engine's logprobs for the new tokens."""
    base = make_request("r", "penalties", seed=8, max_new=6)
    r = Request("r", base.params, base.prompt_ids, output_ids=[65, 66, 67])
    res = engine.run(Schedule.of([(0, r)]))
    assert len(res["r"].token_ids) == 6
    assert alignment_mismatches(model, Sampler(), [r], res) == []


def test_extra_logprobs_modes_equal_rescore(model):
    eng = Engine(model, config=EngineConfig(extra_logprobs_modes=("scaled", "processed")))
    reqs = mixed_requests("raw")
    res = eng.run(Schedule.of([(i % 3, r) for i, r in enumerate(reqs)]))
    for r in reqs:
        out = res[r.rid]
        assert set(out.logprobs) == {"raw", "scaled", "processed"}
        for mode in ("scaled", "processed"):
            lp = rescore(model, Sampler(), with_mode(r.params, mode), r.prompt_ids, out.token_ids)
            assert torch.equal(bits(out.logprobs[mode]), bits(lp)), (r.rid, mode)


def test_extra_mode_equal_to_own_mode_is_recorded_once(model):
    """Bug pinned: a request whose own logprobs_mode is also an extra mode got that
    mode's logprobs appended twice (8 values for 4 tokens)."""
    eng = Engine(model, config=EngineConfig(extra_logprobs_modes=("raw",)))
    r = mixed_requests("raw")[0]
    out = eng.run(Schedule.of([(0, r)]))[r.rid]
    assert len(out.logprobs["raw"]) == len(out.token_ids)


def test_batch_composition_invariance(engine):
    """Mixed schedule == each request alone == permuted, differently split schedule."""
    reqs = mixed_requests()
    mixed = engine.run(Schedule.of([(i % 5, r) for i, r in enumerate(reqs)]))
    rng = random.Random(0)
    perm = reqs[:]
    rng.shuffle(perm)
    split = Engine(engine.model, config=EngineConfig(max_batch_size=3)).run(
        Schedule.of([(rng.randint(0, 20), r) for r in perm])
    )
    assert mixed.steps != split.steps
    for r in reqs:
        alone = engine.run(Schedule.of([(0, r)]))
        assert same_result(mixed[r.rid], alone[r.rid]), r.rid
        assert same_result(split[r.rid], alone[r.rid]), r.rid


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_chunked_prefill_invariance(model, engine, chunk):
    """Prompts prefilled in chunks, in the same model call as other rows' decode tokens,
    give every request bitwise its unchunked result; a request starts sampling only
    after its last chunk."""
    reqs = mixed_requests()
    sched = Schedule.of([(i % 4, r) for i, r in enumerate(reqs)])
    ref = engine.run(sched)
    got = Engine(model, config=EngineConfig(prefill_chunk=chunk)).run(sched)
    for r in reqs:
        assert same_result(got[r.rid], ref[r.rid])
        out = got[r.rid]
        first_sample_step = out.finish_step - len(out.token_ids) + 1  # one token per step
        chunks = -(-len(r.prompt_ids) // chunk)
        assert first_sample_step == out.arrival_step + chunks - 1


def test_run_to_run(model):
    reqs = mixed_requests()
    sched = Schedule.of([(i % 3, r) for i, r in enumerate(reqs)])
    a = Engine(model).run(sched)
    b = Engine(RefModel(RefModelConfig()), Sampler()).run(sched)
    assert a.steps == b.steps
    assert all(same_result(a[r.rid], b[r.rid]) for r in reqs)


def test_thread_count(model, num_threads):
    reqs = mixed_requests("scaled")
    sched = Schedule.of([(i % 6, r) for i, r in enumerate(reqs)])
    with num_threads(1):
        a = Engine(model).run(sched)
    with num_threads(2):
        b = Engine(model).run(sched)
    assert all(same_result(a[r.rid], b[r.rid]) for r in reqs)


def test_unseeded_request_reports_its_seed(engine):
    r = Request("u", SamplingParams(max_new_tokens=4), [1, 2, 3])
    out = engine.run(Schedule.of([(0, r)]))["u"]
    assert out.seed == r.params.seed
    again = engine.run(Schedule.of([(0, Request("u", SamplingParams(max_new_tokens=4, seed=out.seed), [1, 2, 3]))]))
    assert same_result(out, again["u"])


def test_stops_on_stop_token(engine):
    base = make_request("s", "plain", seed=3, max_new=20)
    first = engine.run(Schedule.of([(0, base)]))["s"]
    stop = first.token_ids[4]
    at = first.token_ids.index(stop)
    r = Request("s", base.params.replace(stop_token_ids=(stop,)), base.prompt_ids)
    out = engine.run(Schedule.of([(0, r)]))["s"]
    assert out.finish_reason == "stop"
    assert out.token_ids == first.token_ids[: at + 1]


def test_stop_after_ends_the_request_at_the_first_token_it_accepts(engine):
    """Stop strings were applied after generation: the engine computed every token up to
    max_new_tokens and the caller cut them, so a stopped request cost a full one. Now
    ``run(stop_after=...)`` ends it at that token: fewer steps, the same bits as a prefix."""
    base = make_request("s", "plain", seed=3, max_new=20)
    other = make_request("o", "topp", seed=5, max_new=20)
    sched = Schedule.of([(0, base), (0, other)])
    free = engine.run(sched)
    target = free["s"].token_ids[5]
    at = free["s"].token_ids.index(target)
    asked = []

    def stop_after(request, ids):
        asked.append((request.rid, len(ids)))
        return request.rid == "s" and ids[-1] == target

    out = engine.run(sched, stop_after=stop_after)
    assert out["s"].finish_reason == "stop"
    assert out["s"].token_ids == free["s"].token_ids[: at + 1]
    assert torch.equal(bits(out["s"].logprobs["raw"]), bits(free["s"].logprobs["raw"][: at + 1]))
    assert same_result(out["o"], free["o"])  # the neighbour is untouched
    assert max(n for rid, n in asked if rid == "s") == at + 1  # nothing past the stop computed


def test_stops_on_eos(engine):
    r = Request("e", SamplingParams(seed=1, logit_bias={0: 50.0}, max_new_tokens=9), [7, 8])
    out = engine.run(Schedule.of([(0, r)]))["e"]
    assert out.token_ids == (0,) and out.finish_reason == "eos"


def test_stops_at_max_new_tokens(engine):
    r = make_request("m", "plain", seed=4, max_new=5)
    out = engine.run(Schedule.of([(0, r)]))["m"]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    d = Engine(engine.model, config=EngineConfig(default_max_new_tokens=3)).run(
        Schedule.of([(0, Request("d", SamplingParams(seed=2), [1]))])
    )["d"]
    assert len(d.token_ids) == 3 and d.finish_reason == "length"


def test_stops_at_max_seq_len():
    m = RefModel(RefModelConfig(max_seq_len=10, d_model=32, n_heads=2))
    r = Request("x", SamplingParams(seed=0, max_new_tokens=50, logit_bias={0: -100.0}), [1, 2, 3, 4, 5, 6])
    out = Engine(m).run(Schedule.of([(0, r)]))["x"]
    # positions 5..9 each sample one token; the fifth token would need position 10
    assert out.finish_reason == "max_seq_len" and len(out.token_ids) == 10 - 6 + 1


class _AllNegInf(LogitsProcessor):
    """Batch-level logits processor that leaves no admissible token in any row."""

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        pass

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, float("-inf"))


def test_no_admissible_token_finishes_request(model):
    r = make_request("n", "plain", seed=5)
    out = Engine(model, Sampler(processors=(_AllNegInf(),))).run(Schedule.of([(0, r)]))["n"]
    assert out.token_ids == () and out.finish_reason == "no_valid_token"
    assert out.logprobs["raw"].shape == (0,)


def test_grammar_requests_follow_their_grammar(model):
    """A regex and a JSON-schema request next to free ones: outputs obey the grammar,
    finish as grammar_terminated, and align with rescoring (matcher state replayed)."""
    vocab = Vocabulary.default()
    reqs = [
        Request("re", SamplingParams(seed=1, regex=REGEX, max_new_tokens=20), [2, 3]),
        Request("js", SamplingParams(seed=2, json_schema=SCHEMA, max_new_tokens=60), [4]),
        make_request("free", "plain", 3),
    ]
    eng = Engine(model, config=EngineConfig(vocab=vocab))
    res = eng.run(Schedule.of([(0, reqs[0]), (1, reqs[1]), (1, reqs[2])]))
    assert res["re"].finish_reason == "grammar_terminated"
    assert re.fullmatch(REGEX, vocab.decode(res["re"].token_ids).decode())
    assert res["js"].finish_reason == "grammar_terminated"
    doc = json.loads(vocab.decode(res["js"].token_ids))
    assert isinstance(doc["a"], int)
    assert alignment_mismatches(model, Sampler(), reqs, res, vocab=vocab) == []
    assert invariance_mismatches(eng, Schedule.of([(0, r) for r in reqs])) == []


def test_max_batch_size_and_fifo(model):
    reqs = [make_request(f"q{i}", "plain", seed=i, max_new=3 + i) for i in range(6)]
    res = Engine(model, config=EngineConfig(max_batch_size=2)).run(Schedule.of([(0, r) for r in reqs]))
    assert max(len(s) for s in res.steps) == 2
    first_seen = {}
    for k, s in enumerate(res.steps):
        for rid in s:
            first_seen.setdefault(rid, k)
    order = sorted(first_seen, key=lambda rid: (first_seen[rid], rid))
    assert order == [r.rid for r in reqs]


def test_idle_gap_between_arrivals(engine):
    a, b = make_request("a", "greedy", 1, max_new=2), make_request("b", "greedy", 2, max_new=2)
    res = engine.run(Schedule.of([(0, a), (100, b)]))
    assert res["b"].arrival_step == 100 and res["b"].finish_step == 101
    assert res.steps == [("a",), ("a",), ("b",), ("b",)]


BAD_SCHEDULES = [
    (lambda: Schedule.of([(-1, Request("a", prompt_ids=[1]))]), "arrival step must be"),
    (
        lambda: Schedule.of([(0, Request("a", prompt_ids=[1])), (1, Request("a", prompt_ids=[2]))]),
        "unique, got 'a' twice",
    ),
    (lambda: Schedule.of([(0, Request("a", prompt_ids=[]))]), "'a': prompt_ids must not be empty"),
    (lambda: EngineConfig(max_batch_size=0), "max_batch_size must be None or >= 1, got 0"),
    (lambda: EngineConfig(extra_logprobs_modes=("logits",)), "got 'logits'"),
    (lambda: EngineConfig(default_max_new_tokens=0), "default_max_new_tokens must be >= 1"),
    (lambda: EngineConfig(prefill_chunk=0), "prefill_chunk must be None or >= 1, got 0"),
    (lambda: EngineConfig(eos_token_ids=(0, -2)), "eos_token_ids must hold non-negative"),
]


@pytest.mark.parametrize("build,msg", BAD_SCHEDULES)
def test_bad_schedules(build, msg):
    with pytest.raises(InvalidSamplingParams, match=msg):
        build()


def test_bad_request_rejected_before_any_work(engine):
    good = make_request("g", "plain", 1)
    bad = Request("b", SamplingParams(seed=1), [1, 600])
    with pytest.raises(InvalidSamplingParams, match="'b': prompt_ids contains token id 600"):
        engine.run(Schedule.of([(0, good), (0, bad)]))
    long = Request("l", SamplingParams(seed=1), [1] * 1024)
    with pytest.raises(InvalidSamplingParams, match="'l'.*max_seq_len=1024"):
        engine.run(Schedule.of([(0, long)]))
    assert same_result(engine.run(Schedule.of([(0, good)]))["g"], engine.run(Schedule.of([(0, good)]))["g"])


class _CountingEngine(Engine):
    """Counts model steps, to tell an up-front rejection from a mid-run one."""

    forward_calls = 0

    def _forward(self, st):
        self.forward_calls += 1
        return super()._forward(st)


LATE_BAD = [  # a request that only the batch build (at its admission) used to reject
    (
        "float32-underflow repetition",
        dict(repetition_penalty=1e-50),
        r"'b': repetition_penalty must be representable in float32 \(finite, non-zero\)",
    ),
    (
        "float32-overflow presence",
        dict(presence_penalty=1e39),
        r"'b': presence_penalty must be representable in float32 \(finite\)",
    ),
    ("processor not callable", dict(logits_processor=7), "'b': logits_processor must be callable"),
]


@pytest.mark.parametrize("kw,msg", [b[1:] for b in LATE_BAD], ids=[b[0] for b in LATE_BAD])
def test_late_arriving_bad_request_rejected_before_any_work(model, kw, msg):
    """Bug pinned: Engine._check validated token ids only, so a request whose penalty is
    invalid in float32 (or whose processor is not callable) passed the up-front check and
    raised at its admission step, after the model had run and discarding every other
    request's results."""
    eng = _CountingEngine(model)
    good = make_request("g", "plain", 1)
    bad = Request("b", SamplingParams(seed=2, **kw), [3, 4])
    with pytest.raises(InvalidSamplingParams, match=msg):
        eng.run(Schedule.of([(0, good), (2, bad)]))
    assert eng.forward_calls == 0


class _RejectsTopK(_AllNegInf):
    """A processor that serves no request with top_k set."""

    def validate_params(self, params) -> None:
        if params.top_k != -1:
            raise InvalidSamplingParams(f"top_k must be -1, got {params.top_k}")

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_request_rejected_by_a_processor_before_any_work(model):
    """Bug pinned: the engine never asked the Sampler's processors (validate_params) up
    front, so a late request they reject raised at its admission step, mid-run."""
    eng = _CountingEngine(model, Sampler(processors=(_RejectsTopK(),)))
    good = make_request("g", "plain", 1)
    bad = make_request("b", "hot_topk", 2)
    with pytest.raises(InvalidSamplingParams, match="'b' rejected by _RejectsTopK: top_k"):
        eng.run(Schedule.of([(0, good), (2, bad)]))
    assert eng.forward_calls == 0


def test_grammar_request_without_vocabulary_rejected_before_any_work():
    """Bug pinned: a grammar request on a model without the default vocabulary layout
    (and no EngineConfig.vocab) raised only when it joined the batch, mid-run."""
    small = RefModel(RefModelConfig(vocab_size=300, n_layers=1, d_model=16, n_heads=2))
    good = Request("g", SamplingParams(seed=1, max_new_tokens=2), [1, 2])
    bad = Request("b", SamplingParams(seed=2, regex="a+"), [3])
    eng = _CountingEngine(small)
    with pytest.raises(InvalidSamplingParams, match="'b': regex needs a vocabulary"):
        eng.run(Schedule.of([(0, good), (3, bad)]))
    assert eng.forward_calls == 0


def test_rescore_edge_cases(model):
    p = SamplingParams(seed=1)
    assert rescore(model, Sampler(), p, [1, 2], []).shape == (0,)
    with pytest.raises(InvalidSamplingParams, match="prompt_ids must not be empty"):
        rescore(model, Sampler(), p, [], [1])


_ALONE: dict[tuple, RequestResult] = {}


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_property_random_schedules(model, data):
    """Hypothesis: any arrivals, families, modes and batch caps: each request == alone,
    and its logprobs == rescore."""
    n = data.draw(st.integers(1, 7), label="n")
    fams = data.draw(st.lists(st.sampled_from(sorted(PARAMS)), min_size=n, max_size=n))
    modes = data.draw(st.lists(st.sampled_from(["raw", "scaled"]), min_size=n, max_size=n))
    steps = data.draw(st.lists(st.integers(0, 8), min_size=n, max_size=n))
    seeds = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    cap = data.draw(st.sampled_from([None, 1, 2, 5]), label="max_batch_size")
    chunk = data.draw(st.sampled_from([None, 1, 4]), label="prefill_chunk")
    reqs = [make_request(f"{i}", f, s, m, max_new=6) for i, (f, s, m) in enumerate(zip(fams, seeds, modes))]
    # plus one request with arbitrary sampling parameters (any filter, bias, mode)
    p = data.draw(params_strategy(512), label="params")
    p = p.replace(max_new_tokens=5)
    reqs.append(Request("any", p, [3, 1, 4, 1, 5]))
    fams, seeds, modes = fams + ["any"], seeds + [p.seed], modes + [p.logprobs_mode]
    steps = steps + [data.draw(st.integers(0, 8))]
    res = Engine(model, config=EngineConfig(max_batch_size=cap, prefill_chunk=chunk)).run(
        Schedule.of(list(zip(steps, reqs)))
    )
    for r, f, s, m in zip(reqs, fams, seeds, modes):
        key = (r.rid, f, s, m)
        if key not in _ALONE:
            _ALONE[key] = Engine(model).run(Schedule.of([(0, r)]))[r.rid]
        assert same_result(res[r.rid], _ALONE[key])
        lp = rescore(model, Sampler(), r.params, r.prompt_ids, res[r.rid].token_ids)
        assert torch.equal(bits(lp), bits(res[r.rid].logprobs[m]))
