"""detsample/processors_builtin.py: min-p, logit bias and min-tokens on the processor
interface, bit-for-bit equal to the core's ops on the same logits.

Pins: a built-in processor whose state drifts from the batch after filter/merge/advance
(wrong row gets the bias, stale min-tokens count), and a processor rule that differs
from the core rule (e.g. min-p on unscaled logits, bias accumulated twice).
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import Request, Sampler, SamplingBatch, SamplingParams, arith
from detsample.ops.bias import apply_logit_bias_
from detsample.ops.penalties import ban_tokens_
from detsample.ops.temperature import row_max, scale_logits
from detsample.processors.builtin import LogitBiasLogitsProcessor, MinPLogitsProcessor, MinTokensLogitsProcessor
from detsample.processors.penalties import banned_entries
from tests.penalty_cases import EOS, V, request_st

token = st.integers(0, V - 1)


@st.composite
def biased_request(draw, i):
    r = draw(request_st(i))
    bias = draw(st.dictionaries(token, st.floats(-5, 5), max_size=4)) or None
    r.params = r.params.replace(logit_bias=bias, logits_processor=None)
    return r


def core_bias(x, batch):
    coo = batch.logit_bias_coo()
    return apply_logit_bias_(x, *coo) if coo is not None else x


def core_min_tokens(x, batch):
    stops, _ = banned_entries(batch, batch.constraint_rows())
    if stops:
        rc = torch.tensor(stops)
        ban_tokens_(x, rc[:, 0], rc[:, 1])
    return x


def core_min_p(x, batch):
    """The step-8 keep rule of the core, exp(z) >= min_p on sampling rows."""
    t = torch.where(batch.greedy.unsqueeze(1), torch.ones_like(batch.temperatures), batch.temperatures)
    z = scale_logits(x, row_max(x), t)
    use = (~batch.greedy) & (batch.min_ps > 0)
    drop = (arith.exp(z) < batch.min_ps.unsqueeze(1)) & use.unsqueeze(1)
    return x.masked_fill(drop, float("-inf"))


PAIRS = [
    (LogitBiasLogitsProcessor, core_bias),
    (MinTokensLogitsProcessor, core_min_tokens),
    (MinPLogitsProcessor, core_min_p),
]


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_builtins_equal_core_ops_through_composition(data):
    n = data.draw(st.integers(2, 8))
    pool = [data.draw(biased_request(i)) for i in range(n)]
    batch = SamplingBatch.from_requests(pool[: n // 2], V, eos_token_ids=EOS)
    rest = pool[n // 2 :]
    sampler = Sampler(processors=tuple(cls() for cls, _ in PAIRS))
    for step in range(data.draw(st.integers(2, 10))):
        op = data.draw(st.sampled_from(["advance", "filter", "merge"]))
        if op == "advance" and len(batch):
            batch.advance(data.draw(st.lists(token, min_size=len(batch), max_size=len(batch))))
        elif op == "filter" and len(batch):
            keep = data.draw(st.permutations(range(len(batch))))
            batch.filter(keep[: data.draw(st.integers(0, len(keep)))])
        elif op == "merge" and rest:
            batch.merge(SamplingBatch.from_requests([rest.pop()], V, eos_token_ids=EOS))
        sampler._runner.sync(batch)
        x = torch.randn((len(batch), V), generator=torch.Generator().manual_seed(step)) * 3
        for proc, (cls, core) in zip(sampler.processors, PAIRS):
            got = proc.apply(x.clone())
            want = core(x.clone(), batch)
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), cls.__name__
            fresh = cls()
            fresh.update_state(batch.update_since([]))
            assert fresh.slots == proc.slots, cls.__name__


def test_cached_tensors_are_built_once_per_batch_change():
    """Bug pinned: the built-in processors cached CPU tensors and copied them to the
    logits' device on every ``apply``; the bias COO was a second copy of the batch's
    loop. The device tensors are now cached until the batch changes, and both COO
    forms come from one builder (``ops.bias.bias_coo``), with equal bits."""
    ps = [SamplingParams(seed=i, logit_bias={i: 0.5, 3: -1.0}, min_p=0.1, temperature=0.8) for i in range(3)]
    batch = SamplingBatch.from_requests([Request(str(i), p) for i, p in enumerate(ps)], V, eos_token_ids=EOS)
    procs = (LogitBiasLogitsProcessor(), MinPLogitsProcessor())
    sampler = Sampler(processors=procs)
    sampler._runner.sync(batch)
    x = torch.zeros(3, V)
    for p in procs:
        p.apply(x.clone())
    cached = [p._cache for p in procs]
    for p in procs:
        p.apply(x.clone())
    assert all(p._cache is c for p, c in zip(procs, cached))
    assert all(torch.equal(a, b) for a, b in zip(procs[0]._cache, batch.logit_bias_coo()))
    assert batch.logit_bias_coo() is batch.logit_bias_coo()
    batch.filter([2, 0])
    sampler._runner.sync(batch)
    procs[0].apply(torch.zeros(2, V))
    assert procs[0]._cache is not cached[0]
    assert all(torch.equal(a, b) for a, b in zip(procs[0]._cache, batch.logit_bias_coo()))
