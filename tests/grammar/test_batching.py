"""Tests of detsample/grammar/batching.py: grammars inside SamplingBatch and Sampler.

Pins batch invariance with grammar rows (bitwise), error isolation (a broken grammar
fails its own row only), termination, filter/merge carrying matchers, and the
sample/compute_logprobs alignment under a grammar mask.
"""

import concurrent.futures as cf
import json
import re
import zlib

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detsample import GrammarError, InvalidSamplingParams, Request, Sampler, SamplingBatch, SamplingParams, Vocabulary
from detsample.grammar import RequestGrammar
from detsample.grammar.batching import FINISH_GRAMMAR_ERROR, FINISH_GRAMMAR_TERMINATED, grammar_errors
from detsample.rules import STATUS_GRAMMAR_ERROR
from tests.penalty_cases import EOS, LowerNonMax, PenalizeLastToken, params_st

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "tag": {"enum": ["red", "green"]},
        "ok": {"type": "boolean"},
    },
    "required": ["id", "tag", "ok"],
}
REGEX = r"(yes|no)-[0-9]{2}"

ROWS = {  # rid -> SamplingParams (free rows mixed with grammar rows)
    "json": SamplingParams(seed=11, temperature=0.9, json_schema=SCHEMA, logprobs=2, logprobs_mode="scaled"),
    "free-a": SamplingParams(seed=12, temperature=1.1, top_k=40),
    "regex": SamplingParams(seed=13, regex=REGEX, top_p=0.9),
    "free-greedy": SamplingParams(seed=14, temperature=0.0, logprobs=1),
    "json-greedy": SamplingParams(seed=15, temperature=0.0, json_schema=json.dumps(SCHEMA)),
    "free-b": SamplingParams(seed=16, min_p=0.05, logprobs_mode="processed"),
}
MAX_STEPS = 40


def logits_for(rid, step, vocab_size=512):
    """Per-(request, step) logits, independent of the batch the request sits in."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{rid}/{step}".encode()))
    return torch.randn(vocab_size, generator=g) * 4


def make_batch(rids, vocab, vocab_size=512):
    reqs = [Request(rid=r, params=ROWS[r], prompt_ids=[5, 6, 7]) for r in rids]
    return SamplingBatch.from_requests(reqs, vocab_size=vocab_size, vocab=vocab)


def run(batch, sampler, steps=MAX_STEPS, on_step=None):
    """Sample/advance; finished rows are filtered out. Returns {rid: [(tok, lp, top)]}."""
    trace = {r.rid: [] for r in batch.requests}
    for step in range(steps):
        if len(batch) == 0:
            break
        if on_step is not None:
            on_step(step, batch)
        logits = torch.stack([logits_for(r.rid, len(batch.output_ids[i])) for i, r in enumerate(batch.requests)])
        pos = torch.tensor([len(r.prompt_ids) + len(o) - 1 for r, o in zip(batch.requests, batch.output_ids)])
        out = sampler.sample(logits, batch, pos)
        for i, r in enumerate(batch.requests):
            top = None if out.top_logprobs is None else (out.top_logprobs[0][i].clone(), out.top_logprobs[1][i].clone())
            trace[r.rid].append((int(out.token_ids[i]), out.logprobs[i].clone(), top, int(out.status[i])))
        batch.advance(out.token_ids)
        batch.filter([i for i, f in enumerate(batch.finished) if f is None])
    return trace


def assert_same_trace(a, b):
    assert len(a) == len(b)
    for (ta, la, pa, sa), (tb, lb, pb, sb) in zip(a, b):
        assert ta == tb and sa == sb and torch.equal(la, lb)
        if pa is not None and pb is not None:
            n = min(pa[0].numel(), pb[0].numel())
            assert torch.equal(pa[0][:n], pb[0][:n]) and torch.equal(pa[1][:n], pb[1][:n])


@pytest.fixture(scope="module")
def solo():
    vocab = Vocabulary.default()
    return {rid: run(make_batch([rid], vocab), Sampler())[rid] for rid in ROWS}, vocab


def test_grammar_rows_produce_valid_text(solo):
    traces, vocab = solo
    for rid in ("json", "json-greedy"):
        ids = [t for t, *_ in traces[rid]]
        assert ids[-1] == 0
        jsonschema.validate(json.loads(vocab.decode(ids)), SCHEMA)
    ids = [t for t, *_ in traces["regex"]]
    assert re.fullmatch(REGEX, vocab.decode(ids).decode())


@pytest.mark.parametrize("order", [[5, 4, 3, 2, 1, 0], [2, 0, 5, 1, 3, 4], [1, 3, 0, 2, 4, 5]])
def test_mixed_shuffled_batch_is_bitwise_solo(solo, order):
    """Bug pinned: a batch-level grammar path (clone, fill, apply) must not change any
    row -- grammar or free -- compared with that row sampled alone."""
    traces, vocab = solo
    rids = [list(ROWS)[i] for i in order]
    mixed = run(make_batch(rids, vocab), Sampler())
    for rid in ROWS:
        assert_same_trace(mixed[rid], traces[rid])


def test_filter_and_merge_carry_matchers(solo):
    """Rows split into two batches, merged back after 3 steps, permuted every step."""
    traces, vocab = solo
    sampler = Sampler()
    rids = list(ROWS)
    first, second = make_batch(rids[:3], vocab), make_batch(rids[3:], vocab)
    part = {}
    for b in (first, second):
        for step in range(3):
            part_trace = run(b, sampler, steps=1)
            for rid, tr in part_trace.items():
                part.setdefault(rid, []).extend(tr)
    first.merge(second)

    def permute(step, batch):
        batch.filter(list(reversed(range(len(batch)))))
        assert [g.rid if g else None for g in batch.grammars] == [
            r.rid if r.params.grammar else None for r in batch.requests
        ]

    rest = run(first, sampler, steps=MAX_STEPS - 3, on_step=permute)
    for rid in ROWS:
        assert_same_trace(part.get(rid, []) + rest.get(rid, []), traces[rid])


BROKEN = {
    "bad-schema": SamplingParams(seed=1, json_schema='{"type": "object", "properties": 7}'),
    "bad-regex": SamplingParams(seed=2, regex="([a-z]"),
    "bad-tag": SamplingParams(seed=3, structural_tag={"type": "no-such-format"}),
    "bad-ebnf": SamplingParams(seed=4, ebnf="root ::= missing"),
}


def test_broken_grammars_fail_their_rows_only(solo):
    traces, vocab = solo
    ROWS.update(BROKEN)
    try:
        rids = ["bad-schema", "json", "bad-regex", "free-a", "bad-tag", "regex", "bad-ebnf"]
        batch = make_batch(rids, vocab)
        logits = torch.stack([logits_for(r, 0) for r in rids])
        out = Sampler().sample(logits, batch, torch.full((len(rids),), 2))
        for i, rid in enumerate(rids):
            if rid in BROKEN:
                assert int(out.token_ids[i]) == -1 and out.status[i] & STATUS_GRAMMAR_ERROR
        batch.advance(out.token_ids)
        errs = grammar_errors(batch)
        assert set(errs) == set(BROKEN)
        assert errs["bad-regex"].startswith("request 'bad-regex': regex grammar failed to compile")
        assert errs["bad-schema"].startswith("request 'bad-schema': json_schema grammar failed")
        assert all(batch.finished[i] == FINISH_GRAMMAR_ERROR for i, r in enumerate(rids) if r in BROKEN)
        batch.filter([i for i, f in enumerate(batch.finished) if f is None])
        rest = run(batch, Sampler(), steps=MAX_STEPS - 1)
        for i, rid in enumerate(rids):
            if rid not in BROKEN:
                tok, lp, _, st = traces[rid][0]
                assert int(out.token_ids[i]) == tok and torch.equal(out.logprobs[i], lp)
                assert_same_trace(rest[rid], traces[rid][1:])
    finally:
        for k in BROKEN:
            ROWS.pop(k)


def test_compile_timeout_fails_row_only():
    vocab = Vocabulary.default()
    batch = make_batch(["free-a", "regex"], vocab)
    batch.grammars[1] = RequestGrammar("regex", "regex", cf.Future(), vocab, timeout_s=0.01)
    logits = torch.stack([logits_for("free-a", 0), logits_for("regex", 0)])
    out = Sampler().sample(logits, batch, torch.tensor([2, 2]))
    assert int(out.token_ids[1]) == -1 and out.status[1] & STATUS_GRAMMAR_ERROR
    assert int(out.token_ids[0]) >= 0 and out.status[0] == 0
    batch.advance(out.token_ids)
    assert grammar_errors(batch) == {"regex": "request 'regex': regex grammar did not compile within 0.01 s"}


def test_rejected_token_raises_after_all_rows_recorded():
    vocab = Vocabulary.default()
    batch = make_batch(["free-a", "regex", "free-b"], vocab)
    batch.grammars[1].resolve()
    with pytest.raises(
        GrammarError,
        match=r"request 'regex'.*rejected token 121 \(b'x'\) "
        r"after accepted prefix b''",
    ):
        batch.advance([3, 121, 4])
    assert batch.output_ids == [[3], [121], [4]]
    assert batch.finished == [None, FINISH_GRAMMAR_ERROR, None]


def test_terminated_grammar_finishes_row_and_stops_masking():
    vocab = Vocabulary.default()
    batch = make_batch(["regex", "free-a"], vocab)
    for t in vocab.encode("no-42") + [0]:
        batch.advance([t, 1])
    assert batch.finished == [FINISH_GRAMMAR_TERMINATED, None]
    assert batch.grammars[0].is_terminated()
    logits = torch.randn(2, 512)
    prep = Sampler()._prepare(logits, batch)
    assert torch.equal(prep.x, logits)  # nothing masked any more


def test_grammar_without_vocab_is_clear_error():
    with pytest.raises(InvalidSamplingParams, match="request 'regex': regex needs a vocabulary"):
        SamplingBatch.from_requests([Request(rid="regex", params=ROWS["regex"])], vocab_size=512)


def test_compute_logprobs_matches_sample_under_mask():
    vocab = Vocabulary.default()
    rids = ["json", "free-a", "regex", "free-b"]
    batch = make_batch(rids, vocab)
    logits = torch.stack([logits_for(r, 0) for r in rids])
    s = Sampler()
    out = s.sample(logits, batch, torch.full((4,), 2))
    assert torch.equal(s.compute_logprobs(logits, batch, out.token_ids), out.logprobs)


def test_padded_model_vocab_never_picks_beyond_tokenizer():
    """A model vocabulary larger than the tokenizer's: padded ids are disallowed on
    grammar rows (xgrammar only fills ceil(512/32) words)."""
    vocab = Vocabulary.default()
    batch = make_batch(["regex"], vocab, vocab_size=600)
    logits = torch.zeros(1, 600)
    logits[0, 512:] = 100.0
    out = Sampler().sample(logits, batch, torch.tensor([2]))
    assert 0 < int(out.token_ids[0]) < 512


def _regex_row_left_without_tokens():
    """A [regex, free] batch whose logits are -inf on every first token the regex allows;
    returns (batch, sample output)."""
    vocab = Vocabulary.default()
    batch = make_batch(["regex", "free-a"], vocab)
    logits = torch.randn(2, 512)
    for t in [vocab.encode("y")[0], vocab.encode("n")[0]]:
        logits[0, t] = float("-inf")
    return batch, Sampler().sample(logits, batch, torch.tensor([2, 2]))


def test_grammar_leaving_no_token_reports_no_valid_token():
    """Bug pinned: when an earlier step removed every token the grammar allows (here the
    model's logits are -inf on them), the row must yield -1, not an arbitrary token."""
    _, out = _regex_row_left_without_tokens()
    assert int(out.token_ids[0]) == -1 and int(out.token_ids[1]) >= 0


def test_merge_rejects_grammar_rows_of_another_vocabulary_without_change():
    vocab = Vocabulary.default()
    toks = list(vocab.tokens)
    toks[300] = b"other-token"
    other_vocab = Vocabulary.from_tokens(toks, eos_token_ids=[0])
    a = make_batch(["regex", "free-a"], vocab)
    b = make_batch(["json"], other_vocab)
    with pytest.raises(InvalidSamplingParams, match="merge: grammar rows need one vocabulary"):
        a.merge(b)
    assert len(a) == 2 and len(a.grammars) == 2 and a.temperatures.shape[0] == 2
    free = make_batch(["free-b"], None)
    a.merge(free)
    assert len(a) == 3 and a.vocab is vocab and a.grammars[2] is None


def test_finished_grammar_row_sampled_again_does_not_break_the_batch():
    """Bug pinned: a grammar row finished with no_valid_token is no longer masked; if the
    caller samples it again before filtering it out, advance fed the unmasked token to
    the matcher and raised GrammarError for the whole batch."""
    batch, out = _regex_row_left_without_tokens()
    batch.advance(out.token_ids)
    assert batch.finished[0] == "no_valid_token"
    again = Sampler().sample(torch.randn(2, 512), batch, torch.tensor([3, 3]))
    batch.advance(again.token_ids)  # must not raise
    assert batch.finished[0] == "no_valid_token" and batch.finished[1] is None


def test_batch_merged_into_two_others_keeps_independent_matchers():
    """Bug pinned: merge appended the other batch's RequestGrammar objects themselves, so
    a batch merged into two others (or advanced after being merged) shared one matcher:
    feeding 'y' in one batch made the other reject 'n' (GrammarError for a valid token)
    and silently moved the source's grammar state."""
    vocab = Vocabulary.default()
    src = make_batch(["regex"], vocab)
    a, b = make_batch([], vocab), make_batch([], vocab)
    a.merge(src)
    b.merge(src)
    assert a.grammars[0] is not b.grammars[0] is not src.grammars[0]
    y, n = vocab.encode("y")[0], vocab.encode("n")[0]
    a.advance([y])
    b.advance([n])  # raised GrammarError: the shared matcher had accepted 'y'
    assert a.grammars[0].accepted == [y] and b.grammars[0].accepted == [n]
    assert src.grammars[0].accepted == []
    assert a.finished == b.finished == [None]


def test_merge_forks_an_advanced_grammar_in_its_state():
    """The merged row's grammar continues from the source row's accepted prefix."""
    vocab = Vocabulary.default()
    src = make_batch(["regex"], vocab)
    for t in vocab.encode("no-4"):
        src.advance([t])
    dst = make_batch(["free-a"], vocab)
    dst.merge(src)
    g = dst.grammars[1]
    assert g.accepted == src.grammars[0].accepted and g.is_active
    for t in vocab.encode("2") + [0]:
        dst.advance([1, t])
    assert dst.finished == [None, FINISH_GRAMMAR_TERMINATED]
    assert src.grammars[0].is_active and src.finished == [None]


def test_resumed_request_with_ended_grammar_yields_no_free_token():
    """Bug pinned: a resumed request whose existing output already terminated its grammar
    (here "no-42" + EOS) was not masked any more but not finished either, so it sampled
    an unconstrained token that advance appended after the EOS. It must yield -1 and
    finish as grammar_terminated, its output unchanged; its neighbour is unaffected."""
    vocab = Vocabulary.default()
    done = vocab.encode("no-42") + [0]
    reqs = [Request("regex", ROWS["regex"], [5], done), Request("free-a", ROWS["free-a"], [5, 6, 7])]
    batch = SamplingBatch.from_requests(reqs, vocab_size=512, vocab=vocab)
    logits = torch.stack([logits_for("regex", 6), logits_for("free-a", 0)])
    out = Sampler().sample(logits, batch, torch.tensor([6, 2]))
    assert int(out.token_ids[0]) == -1 and out.logprobs[0] == float("-inf")
    alone = Sampler().sample(logits[1:], make_batch(["free-a"], vocab), torch.tensor([2]))
    assert torch.equal(out.token_ids[1:], alone.token_ids)
    assert torch.equal(out.logprobs[1:], alone.logprobs)
    batch.advance(out.token_ids)
    assert batch.finished == [FINISH_GRAMMAR_TERMINATED, None]
    assert batch.output_ids[0] == done


@st.composite
def _lineage_request(draw, i):
    """A request from tests.penalty_cases.params_st, with a regex on some rows (a valid
    resumed prefix included)."""
    p = draw(params_st(seed=2000 + i))
    out = draw(st.lists(st.integers(1, 39), max_size=3))
    if draw(st.booleans()):  # (no allowed ids / bad words: they would end it at once)
        p = p.replace(
            regex=REGEX,
            allowed_token_ids=None,
            bad_words=(),
            logit_bias=None if p.logit_bias is None else dict(p.logit_bias),
        )
        out = Vocabulary.default().encode(draw(st.sampled_from(["", "n", "yes-"])))
    return Request(f"q{i}", p, draw(st.lists(st.integers(1, 39), max_size=4)), out)


def _lineage_step(sampler, batch, hist, force=()):
    x = (
        torch.stack([logits_for(r.rid, len(o)) for r, o in zip(batch.requests, batch.output_ids)])
        if len(batch)
        else torch.empty((0, 512))
    )
    pos = torch.tensor(
        [len(r.prompt_ids) + len(o) for r, o in zip(batch.requests, batch.output_ids)], dtype=torch.int64
    )
    out = sampler.sample(x, batch, pos)
    toks = out.token_ids.clone()
    for i in range(len(batch)):
        hist[i].append((int(toks[i]), out.logprobs[i].view(torch.int32).item(), i in force))
        if i in force:
            toks[i] = -1  # the caller ends this row (advance with -1)
    batch.advance(toks)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_rows_equal_alone_when_merged_into_several_batches(data):
    """Bug pinned: merge shared the merged rows' grammar matchers with the source batch, so
    a batch merged into two others (or advanced after a merge) fed one matcher twice.
    Random steps (some rows ended with -1), filters (any order, to empty) and merges that
    keep the source alive, with grammar, penalty, constraint and processor rows: every row
    equals, bitwise, its own history replayed alone."""
    vocab = Vocabulary.default()
    pool = iter([data.draw(_lineage_request(i)) for i in range(data.draw(st.integers(3, 7)))])
    mk = lambda reqs: SamplingBatch.from_requests(reqs, 512, eos_token_ids=EOS, vocab=vocab)  # noqa: E731
    procs = lambda: Sampler(processors=(PenalizeLastToken(), LowerNonMax()))  # noqa: E731

    def new():
        reqs = [r for r in (next(pool, None) for _ in range(data.draw(st.integers(1, 3)))) if r is not None]
        return [procs(), mk(reqs), [[] for _ in reqs]]

    live, done = [new(), new()], []
    for _ in range(data.draw(st.integers(4, 12))):
        op = data.draw(st.sampled_from(["step", "step", "filter", "merge", "merge_keep", "merge_keep", "new"]))
        k = data.draw(st.integers(0, len(live) - 1))
        s, b, h = live[k]
        if op == "step":
            force = set(data.draw(st.lists(st.integers(0, max(len(b) - 1, 0)), max_size=1)) if len(b) else [])
            _lineage_step(s, b, h, force)
        elif op == "filter":
            keep = data.draw(st.permutations(range(len(b))))[: data.draw(st.integers(0, len(b)))]
            done += [(b.requests[i], h[i]) for i in range(len(b)) if i not in keep]
            b.filter(keep)
            live[k][2] = [h[i] for i in keep]
        elif op.startswith("merge") and len(live) > 1:
            j = data.draw(st.sampled_from([i for i in range(len(live)) if i != k]))
            b.merge(live[j][1])
            h.extend(list(x) for x in live[j][2])
            if op == "merge":
                del live[j]
        elif op == "new":
            live.append(new())
    done += [(r, hist) for _, b, h in live for r, hist in zip(b.requests, h)]
    for r, hist in done:
        alone, solo = mk([r]), [[]]
        s = procs()
        for entry in hist:
            _lineage_step(s, alone, solo, {0} if entry[2] else set())
        assert solo[0] == hist, r.rid
