"""Sampler guarantees: batch-composition invariance, run-to-run and thread-count
determinism, sample/compute_logprobs alignment, input errors, regression stories."""

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample import InvalidSamplingParams, Request, Sampler, SamplingBatch, SamplingParams, arith
from tests.helpers import logits_rows, num_threads, params_strategy, requests_from, row_bits_equal, sample_alone

V = 97
FAMILIES = ["random", "ties", "onehot", "neginf", "nan", "huge", "mixed", "peaked", "bf16"]


def _batch(ps, vocab=V):
    return SamplingBatch.from_requests(requests_from(ps), vocab)


@given(st.lists(params_strategy(V), min_size=1, max_size=64), st.sampled_from(FAMILIES), st.integers(0, 2**32 - 1))
def test_every_row_equals_the_row_alone(ps, family, seed):
    """Batch-composition invariance: tokens, logprobs and top logprobs of each row are
    bitwise those of the same request sampled alone (greedy, filtered, biased, NaN and
    -inf neighbours included)."""
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(logits_rows(rng, len(ps), V, family))
    pos = torch.from_numpy(rng.integers(0, 10_000, len(ps)))
    reqs = requests_from(ps)
    s = Sampler()
    out = s.sample(x, SamplingBatch.from_requests(reqs, V), pos)
    for i, r in enumerate(reqs):
        assert row_bits_equal(out, i, sample_alone(s, x[i], r, int(pos[i]), V)), i


@given(
    st.lists(params_strategy(V), min_size=2, max_size=24),
    st.integers(0, 2**32 - 1),
    st.lists(st.tuples(st.sampled_from(["filter", "merge"]), st.integers(0, 2**16)), min_size=1, max_size=6),
)
def test_rows_survive_filter_permute_merge(ps, seed, ops):
    """After any sequence of filter (permuting) and merge, each row samples as alone."""
    rng = np.random.default_rng(seed)
    reqs = requests_from(ps)
    half = len(reqs) // 2
    batch = SamplingBatch.from_requests(reqs[:half], V)
    pending = reqs[half:]
    for op, r in ops:
        if op == "merge" and pending:
            k = 1 + r % len(pending)
            batch.merge(SamplingBatch.from_requests(pending[:k], V))
            pending = pending[k:]
        elif len(batch):
            keep = list(rng.permutation(len(batch))[: 1 + r % len(batch)])
            batch.filter(keep)
    if not len(batch):
        return
    x = torch.from_numpy(logits_rows(rng, len(batch), V, "mixed"))
    pos = torch.from_numpy(rng.integers(0, 1000, len(batch)))
    s = Sampler()
    out = s.sample(x, batch, pos)
    for i, r in enumerate(batch.requests):
        assert row_bits_equal(out, i, sample_alone(s, x[i], r, int(pos[i]), V))


@given(st.lists(params_strategy(V), min_size=1, max_size=32), st.sampled_from(FAMILIES), st.integers(0, 2**32 - 1))
def test_bounded_topk_equals_full_sort(ps, family, seed):
    """The default path (bounded topk, compact draw) gives exactly the bits of the full
    stable sort reference, ties included."""
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(logits_rows(rng, len(ps), V, family))
    pos = torch.from_numpy(rng.integers(0, 1000, len(ps)))
    a = Sampler().sample(x, _batch(ps), pos)
    b = Sampler(filter_impl="sort").sample(x, _batch(ps), pos)
    assert torch.equal(a.token_ids, b.token_ids)
    assert torch.equal(a.logprobs.view(torch.int32), b.logprobs.view(torch.int32))


VN = 4096  # large enough for the nucleus route to grow its candidates (64, then 512)
NUCLEUS_PARAMS = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.3, 0.8, 1.5]),
    top_k=st.sampled_from([-1, -1, 600, 3000, 7]),
    top_p=st.sampled_from([0.5, 0.9, 0.99, 1.0]),
    min_p=st.sampled_from([0.0, 0.0, 0.02]),
    seed=st.integers(0, 2**63 - 1),
    logprobs=st.sampled_from([0, 3]),
    logprobs_mode=st.sampled_from(["raw", "scaled", "processed", "processed_fixed"]),
)


@given(
    st.lists(NUCLEUS_PARAMS, min_size=1, max_size=8),
    st.sampled_from(["peaked", "random", "ties", "neginf", "bf16"]),
    st.integers(0, 2**32 - 1),
)
def test_top_p_without_sort_equals_full_sort(ps, family, seed):
    """Bug pinned: top-p without a (small) top-k always took the full stable sort (1.5 s
    per step at B=64, V=152064). Top-p, min-p and top-p with a large top-k now find the
    threshold on a growing bounded ``topk`` against the exact survivor mass (the sort
    only for rows whose nucleus outgrows V/8), and every output is the sort's bits:
    tokens, logprobs in every mode, top logprobs and the rescoring path; peaked, flat,
    tie-heavy, -inf-heavy and bfloat16-rounded logits."""
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(logits_rows(rng, len(ps), VN, family))
    pos = torch.from_numpy(rng.integers(0, 1000, len(ps)))
    a = Sampler().sample(x, _batch(ps, VN), pos)
    b = Sampler(filter_impl="sort").sample(x, _batch(ps, VN), pos)
    assert torch.equal(a.token_ids, b.token_ids)
    assert torch.equal(a.logprobs.view(torch.int32), b.logprobs.view(torch.int32))
    if b.top_logprobs is not None:
        assert torch.equal(a.top_logprobs[0].view(torch.int32), b.top_logprobs[0].view(torch.int32))
        assert torch.equal(a.top_logprobs[1], b.top_logprobs[1])
    lp = Sampler().compute_logprobs(x, _batch(ps, VN), b.token_ids)
    assert torch.equal(lp.view(torch.int32), b.logprobs.view(torch.int32))


@given(st.lists(NUCLEUS_PARAMS, min_size=1, max_size=6), st.sampled_from([0.3, 1.0, 3.0]), st.integers(0, 2**32 - 1))
def test_flat_nucleus_rows_take_the_radix_select_and_the_sorts_bits(ps, std, seed):
    """Bug pinned: a top-p row whose nucleus outgrew V/8 candidates (flat logits) took
    the full stable sort and the filters' passes over the sorted row (1.35 s at B=64,
    V=152064 against 0.57 s for a bare sort). It now gets the sort's threshold from
    ``ops.radix``; tokens, logprobs, top logprobs and the rescoring path stay the sort's
    bits. The flat rows must actually reach the select (spied)."""
    from detsample.ops import radix

    used = []
    real = radix.thresholds_by_select
    rng = np.random.default_rng(seed)
    x = torch.from_numpy((rng.standard_normal((len(ps), VN)) * std).astype(np.float32))
    ps = [p.replace(top_p=0.9, top_k=-1) if i == 0 else p for i, p in enumerate(ps)]
    pos = torch.from_numpy(rng.integers(0, 1000, len(ps)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(radix, "thresholds_by_select", lambda *a, **k: used.append(1) or real(*a, **k))
        a = Sampler().sample(x, _batch(ps, VN), pos)
        lp = Sampler().compute_logprobs(x, _batch(ps, VN), a.token_ids)
    b = Sampler(filter_impl="sort").sample(x, _batch(ps, VN), pos)
    assert torch.equal(a.token_ids, b.token_ids)
    assert torch.equal(a.logprobs.view(torch.int32), b.logprobs.view(torch.int32))
    if b.top_logprobs is not None:
        assert torch.equal(a.top_logprobs[0].view(torch.int32), b.top_logprobs[0].view(torch.int32))
    assert torch.equal(lp.view(torch.int32), b.logprobs.view(torch.int32))
    if std <= 1.0 and ps[0].temperature >= 0.8:  # row 0's nucleus is flat: > V/8 tokens
        assert used


@given(st.lists(params_strategy(V), min_size=1, max_size=32), st.sampled_from(FAMILIES), st.integers(0, 2**32 - 1))
def test_compute_logprobs_equals_sampling_logprobs(ps, family, seed):
    """Prefill/decode alignment: the rescoring path returns the sampling-time bits."""
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(logits_rows(rng, len(ps), V, family))
    pos = torch.from_numpy(rng.integers(0, 1000, len(ps)))
    s = Sampler()
    out = s.sample(x, _batch(ps), pos)
    ok = out.token_ids >= 0
    lp = s.compute_logprobs(x, _batch(ps), out.token_ids.clamp(min=0))
    assert torch.equal(lp[ok].view(torch.int32), out.logprobs[ok].view(torch.int32))


def test_large_vocab_rows_equal_alone():
    """At vocab 152064 (Qwen), every row's bits equal the row alone."""
    Vb = 152064
    rng = np.random.default_rng(7)
    ps = [
        SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=1, logprobs=2),
        SamplingParams(temperature=0.0, seed=2),
        SamplingParams(temperature=1.0, seed=3, logprobs_mode="processed"),
        SamplingParams(temperature=0.7, top_p=0.95, seed=4, logprobs_mode="scaled"),
        SamplingParams(temperature=1.2, min_p=0.05, seed=5, logit_bias={"17": 5.0}),
    ]
    x = torch.from_numpy((rng.standard_normal((len(ps), Vb)) * 4).astype(np.float32))
    x[2, ::3] = float("-inf")
    pos = torch.tensor([5, 6, 7, 8, 9])
    reqs = requests_from(ps)
    s = Sampler()
    out = s.sample(x, SamplingBatch.from_requests(reqs, Vb), pos)
    ref = Sampler(filter_impl="sort").sample(x, SamplingBatch.from_requests(reqs, Vb), pos)
    assert torch.equal(out.token_ids, ref.token_ids)
    for i, r in enumerate(reqs):
        assert row_bits_equal(out, i, sample_alone(s, x[i], r, int(pos[i]), Vb))


@pytest.mark.parametrize("threads", [1, 2])
def test_thread_count_and_run_to_run(threads):
    """Same inputs, same bits, every run and with 1 or 2 intra-op threads."""
    rng = np.random.default_rng(3)
    ps = [
        SamplingParams(temperature=t, top_k=k, top_p=p, seed=i, logprobs=2)
        for i, (t, k, p) in enumerate(
            [(0.7, -1, 1.0), (1.0, 40, 0.9), (0.0, -1, 1.0), (1.3, -1, 0.8), (0.5, 5, 1.0)] * 4
        )
    ]
    x = torch.from_numpy((rng.standard_normal((len(ps), 4096)) * 3).astype(np.float32))
    pos = torch.arange(len(ps))
    base = Sampler().sample(x, _batch(ps, 4096), pos)
    with num_threads(threads):
        for _ in range(2):
            again = Sampler().sample(x, _batch(ps, 4096), pos)
            assert torch.equal(base.token_ids, again.token_ids)
            assert torch.equal(base.logprobs.view(torch.int32), again.logprobs.view(torch.int32))
            assert torch.equal(base.top_logprobs[0], again.top_logprobs[0])


def test_seeded_row_unaffected_by_batchmate_filters():
    """SGLang PR 35697: noise keyed by sorted rank changed a seeded row when a batch-mate
    enabled top-k/top-p. Our randomness is keyed by (seed, position) and token ids only."""
    rng = np.random.default_rng(0)
    x = torch.from_numpy((rng.standard_normal((2, V)) * 2).astype(np.float32))
    me = SamplingParams(temperature=1.0, seed=1234)
    outs = []
    for mate in [SamplingParams(seed=1), SamplingParams(top_k=3, top_p=0.5, seed=1), SamplingParams(temperature=0.0)]:
        out = Sampler().sample(x, _batch([me, mate]), torch.tensor([10, 10]))
        outs.append((int(out.token_ids[0]), out.logprobs[0].item()))
    assert outs[0] == outs[1] == outs[2]


def test_top_k_1_equals_greedy_on_ties():
    """vLLM 5404: top_k=1 must equal temperature 0 on tied logits (lowest id wins)."""
    x = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0]] * 2)
    out = Sampler().sample(
        x,
        _batch([SamplingParams(top_k=1, temperature=0.9, seed=5), SamplingParams(temperature=0.0)], 5),
        torch.tensor([0, 0]),
    )
    assert out.token_ids.tolist() == [1, 1]
    assert torch.equal(out.logprobs[0], out.logprobs[1])


def test_log_softmax_not_log_of_softmax():
    """log(softmax(x)) and log_softmax(x) differ by ~1e-6 in float32; mixing them between
    the sampling and the rescoring paths breaks alignment. We only use log_softmax."""
    rng = np.random.default_rng(1)
    x = torch.from_numpy((rng.standard_normal((64, 4096)) * 5).astype(np.float32))
    naive = torch.log(torch.softmax(x, -1))
    good = arith.log_softmax(x)
    assert not torch.equal(naive, good)
    assert float((naive - good).abs().max()) > 1e-7
    ps = [SamplingParams(temperature=0.0)] * 64
    out = Sampler().sample(x, _batch(ps, 4096), torch.zeros(64, dtype=torch.int64))
    assert torch.equal(out.logprobs, good.gather(1, out.token_ids[:, None]).squeeze(1))


def test_caller_logits_never_modified():
    rng = np.random.default_rng(2)
    x = torch.from_numpy(logits_rows(rng, 6, V, "mixed"))
    x[4, 3] = float("inf")
    before = x.clone()
    ps = [
        SamplingParams(logit_bias={1: 2.0}, seed=1),
        SamplingParams(temperature=0),
        SamplingParams(top_k=3),
        SamplingParams(top_p=0.5),
        SamplingParams(min_p=0.3),
        SamplingParams(logprobs=3, logprobs_mode="processed"),
    ]
    s = Sampler()
    out = s.sample(x, _batch(ps), torch.arange(6))
    s.compute_logprobs(x, _batch(ps), out.token_ids.clamp(min=0))
    assert torch.equal(x.view(torch.int32), before.view(torch.int32))


def test_nan_and_masked_rows_do_not_touch_neighbours():
    rng = np.random.default_rng(4)
    x = torch.from_numpy((rng.standard_normal((3, V))).astype(np.float32))
    ps = [SamplingParams(seed=1), SamplingParams(seed=2), SamplingParams(seed=3)]
    clean = Sampler().sample(x, _batch(ps), torch.tensor([1, 2, 3]))
    y = x.clone()
    y[1] = float("nan")
    dirty = Sampler().sample(y, _batch(ps), torch.tensor([1, 2, 3]))
    assert dirty.token_ids[[0, 2]].tolist() == clean.token_ids[[0, 2]].tolist()
    assert torch.equal(dirty.logprobs[[0, 2]], clean.logprobs[[0, 2]])
    assert int(dirty.status[1]) & 1
    y[1] = float("-inf")
    masked = Sampler().sample(y, _batch(ps), torch.tensor([1, 2, 3]))
    assert int(masked.token_ids[1]) == -1 and masked.logprobs[1] == float("-inf")
    assert torch.equal(masked.token_ids[[0, 2]], clean.token_ids[[0, 2]])


LOGITS_ERRORS = [
    (lambda: torch.zeros(2, V, dtype=torch.float64), "float32, bfloat16, float16, got torch.float64"),
    (lambda: torch.zeros(2, V, dtype=torch.int32), "got torch.int32"),
    (lambda: torch.zeros(3, V), "shape"),
    (lambda: torch.zeros(2, V + 1), "shape"),
    (lambda: [[0.0] * V] * 2, "torch.Tensor"),
]


@pytest.mark.parametrize("make,msg", LOGITS_ERRORS)
def test_bad_logits_rejected(make, msg):
    with pytest.raises(InvalidSamplingParams, match=msg):
        Sampler().sample(make(), _batch([SamplingParams()] * 2), torch.tensor([0, 0]))


def test_bad_positions_and_token_ids_rejected():
    b = _batch([SamplingParams()] * 2)
    x = torch.zeros(2, V)
    with pytest.raises(InvalidSamplingParams, match="positions"):
        Sampler().sample(x, b, torch.tensor([0]))
    with pytest.raises(InvalidSamplingParams, match="positions"):
        Sampler().sample(x, b, torch.tensor([0, -4]))
    with pytest.raises(InvalidSamplingParams, match="token_ids"):
        Sampler().compute_logprobs(x, b, torch.tensor([0, V]))
    with pytest.raises(InvalidSamplingParams, match="filter_impl"):
        Sampler(filter_impl="radix")


def test_greedy_processed_is_one_hot_and_scaled_uses_t1():
    x = torch.tensor([[0.0, 2.0, 1.0]])
    b = SamplingBatch.from_requests(
        [Request("g", SamplingParams(temperature=0, logprobs=3, logprobs_mode="processed"))], 3
    )
    out = Sampler().sample(x, b, torch.tensor([0]))
    assert out.logprobs.tolist() == [0.0]
    assert out.top_logprobs[0].tolist() == [[0.0, float("-inf"), float("-inf")]]
    assert out.top_logprobs[1].tolist() == [[1, 0, 2]]
    b = SamplingBatch.from_requests([Request("g", SamplingParams(temperature=0, logprobs_mode="scaled"))], 3)
    assert torch.equal(Sampler().sample(x, b, torch.tensor([0])).logprobs, arith.log_softmax(x)[:, 1])


def test_fast_mode_is_seeded_and_valid():
    """The fast mode is statistically correct and reproducible for the same batch; it
    only drops the tie-spill fallback of the bounded topk."""
    rng = np.random.default_rng(5)
    x = torch.from_numpy((rng.standard_normal((8, V))).astype(np.float32))
    ps = [SamplingParams(top_k=5, seed=i) for i in range(8)]
    a = Sampler(deterministic=False).sample(x, _batch(ps), torch.arange(8))
    b = Sampler(deterministic=False).sample(x, _batch(ps), torch.arange(8))
    assert torch.equal(a.token_ids, b.token_ids)
    top5 = torch.topk(x, 5).indices
    assert all(int(a.token_ids[i]) in top5[i].tolist() for i in range(8))


def test_fast_mode_cuts_spilling_ties_at_the_bound():
    """With a tie group larger than the candidate bound, the deterministic mode keeps
    the whole group (full-sort semantics) and the fast mode keeps what topk returned
    (seen in "processed_fixed" logprobs, normalised by the draw's own kept mass)."""
    x = torch.zeros(1, 64)
    x[0, 0] = 5.0  # one clear winner, then 63 tied tokens
    p = SamplingParams(top_k=2, temperature=1.0, seed=0, logprobs_mode="processed_fixed")
    det = Sampler().sample(x, _batch([p], 64), torch.tensor([0]))
    fast = Sampler(deterministic=False).sample(x, _batch([p], 64), torch.tensor([0]))
    ref = Sampler(filter_impl="sort").sample(x, _batch([p], 64), torch.tensor([0]))
    assert torch.equal(det.logprobs, ref.logprobs)
    assert not torch.equal(fast.logprobs, ref.logprobs)  # renormalised over 2 tokens, not 64


DEAD_ROW_MODES = [(mode, t) for mode in ("raw", "scaled", "processed", "processed_fixed") for t in (0.0, 1.0)]


@pytest.mark.parametrize("mode,temperature", DEAD_ROW_MODES)
def test_dead_row_top_logprobs_are_neg_inf_not_nan(mode, temperature):
    """Bug: a row with no admissible token (all -inf) returned NaN top logprobs in raw and
    scaled modes (log_softmax of an all -inf row) and, when greedy in processed mode, a
    logprob of 0 for token 0 although its token is -1. Such a row now reports -inf / -1
    in every top-logprob slot, like its token logprob; the neighbour is untouched."""
    x = torch.randn(2, 10)
    x[0] = float("-inf")
    ps = [
        SamplingParams(temperature=temperature, seed=1, logprobs=2, logprobs_mode=mode),
        SamplingParams(seed=2, logprobs=2, logprobs_mode=mode),
    ]
    out = Sampler().sample(x, _batch(ps, 10), torch.tensor([0, 0]))
    assert int(out.token_ids[0]) == -1
    assert out.top_logprobs[0][0].tolist() == [float("-inf")] * 2
    assert out.top_logprobs[1][0].tolist() == [-1, -1]
    alone = sample_alone(Sampler(), x[1], requests_from(ps)[1], 0, 10)
    assert row_bits_equal(out, 1, alone)


def test_compute_logprobs_accepts_the_no_token_id_of_sample():
    """Bug: ``compute_logprobs(logits, batch, out.token_ids)`` raised for any batch with a
    dead row (sample reports its token as -1), so one bad row broke the rescoring of its
    neighbours. -1 now means "no token" and rescoring gives -inf, bitwise equal to the
    sampling-time logprobs; ids below -1 are still rejected."""
    x = torch.randn(3, 10)
    x[1] = float("-inf")
    ps = [SamplingParams(seed=1, logprobs_mode=m) for m in ("raw", "scaled", "processed")]
    b = _batch(ps, 10)
    s = Sampler()
    out = s.sample(x, b, torch.tensor([4, 5, 6]))
    assert int(out.token_ids[1]) == -1
    lp = s.compute_logprobs(x, b, out.token_ids)
    assert torch.equal(lp.view(torch.int32), out.logprobs.view(torch.int32))
    with pytest.raises(InvalidSamplingParams, match="token_ids"):
        s.compute_logprobs(x, b, torch.tensor([0, -2, 0]))


def test_logits_that_require_grad_are_accepted():
    """Bug: logits straight from a model in training mode (``requires_grad``, e.g. a
    trainer rescoring with compute_logprobs) crashed with autograd's "functions with
    out=... arguments don't support automatic differentiation". Sampling is not
    differentiable: both entry points now run under no_grad and give the same bits as
    for detached logits, leaving the caller's tensor untouched."""
    rng = np.random.default_rng(5)
    x = torch.from_numpy(logits_rows(rng, 3, V, "random"))
    ps = [
        SamplingParams(seed=1, top_k=5, logprobs=2, logprobs_mode="processed"),
        SamplingParams(temperature=0),
        SamplingParams(seed=3, logit_bias={2: 1.0}),
    ]
    s = Sampler()
    ref = s.sample(x, _batch(ps), torch.arange(3))
    g = x.clone().requires_grad_(True)
    out = s.sample(g, _batch(ps), torch.arange(3))
    assert torch.equal(out.token_ids, ref.token_ids)
    assert torch.equal(out.logprobs.view(torch.int32), ref.logprobs.view(torch.int32))
    lp = s.compute_logprobs(g, _batch(ps), ref.token_ids)
    assert torch.equal(lp.view(torch.int32), ref.logprobs.view(torch.int32))
    assert g.grad is None and torch.equal(g.detach(), x)


def test_fast_mode_compute_logprobs_equals_its_sampling_logprobs():
    """Bug: in fast mode a tie group spilling past the topk bound is cut at the bound
    when drawing, but compute_logprobs measured the kept mass over the whole vocabulary,
    so a "processed" rescoring differed from the logprob reported at sampling time.
    Both paths now take the kept mass from the same candidates."""
    x = torch.zeros(1, 400)
    x[0, :50] = 3.0  # a 50-way tie at the top, top_k=10 -> bound 10 spills
    p = SamplingParams(top_k=10, seed=3, logprobs_mode="processed")
    b = _batch([p], 400)
    s = Sampler(deterministic=False)
    out = s.sample(x, b, torch.tensor([1]))
    lp = s.compute_logprobs(x, b, out.token_ids)
    assert torch.equal(lp.view(torch.int32), out.logprobs.view(torch.int32))


def test_position_beyond_int64_rejected_by_name():
    """Bug: a position of 2**63 raised torch's bare "Overflow when unpacking long long"
    instead of InvalidSamplingParams naming ``positions``."""
    b = _batch([SamplingParams()])
    with pytest.raises(InvalidSamplingParams, match="positions"):
        Sampler().sample(torch.zeros(1, V), b, [2**63])
    out = Sampler().sample(torch.zeros(1, V), b, [2**63 - 1])
    assert 0 <= int(out.token_ids[0]) < V


def test_empty_batch_accepts_empty_python_lists():
    """Bug: with B = 0, ``positions=[]`` (or ``token_ids=[]``) was refused as a float32
    tensor ("positions must be an int64 tensor ... got torch.float32 (0,)") because
    ``torch.as_tensor([])`` is float32; an empty Python sequence is now the empty int64
    vector. Non-integer values are still rejected."""
    b = SamplingBatch.from_requests([], V)
    out = Sampler().sample(torch.zeros(0, V), b, [])
    assert out.token_ids.shape == (0,) and out.logprobs.shape == (0,)
    assert Sampler().compute_logprobs(torch.zeros(0, V), b, []).shape == (0,)
    with pytest.raises(InvalidSamplingParams, match="positions"):
        Sampler().sample(torch.zeros(1, V), _batch([SamplingParams()]), [1.5])


def test_certain_token_has_processed_logprob_exactly_zero():
    """Bug pinned: with one kept token (Q == 2**F) the processed logprob was
    log(2**F) - F*ln2 ~ -7e-15 for some vocabulary sizes instead of exactly 0."""
    for V in (1500, 3000, 200_000):
        x = torch.zeros(1, V)
        x[0, 7] = 50.0  # every other token is far below: top_p keeps only token 7
        p = SamplingParams(temperature=1.0, top_p=0.5, seed=1, logprobs_mode="processed")
        out = Sampler().sample(x, _batch([p], V), torch.tensor([0]))
        assert int(out.token_ids[0]) == 7 and out.logprobs[0].item() == 0.0, V


HALF_DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@given(st.lists(params_strategy(V), min_size=1, max_size=12), st.sampled_from(FAMILIES), st.integers(0, 2**32 - 1))
def test_half_precision_logits_equal_their_float32_upcast(dtype, ps, family, seed):
    """Serving engines emit bfloat16 / float16 logits, which the Sampler rejected. They
    are upcast once to float32, and a row gives bitwise what its float32 upcast gives:
    in the batch, alone, and on the rescoring path."""
    rng = np.random.default_rng(seed)
    half = torch.from_numpy(logits_rows(rng, len(ps), V, family)).to(dtype)
    up = half.to(torch.float32)
    pos = torch.from_numpy(rng.integers(0, 10_000, len(ps)))
    reqs = requests_from(ps)
    s = Sampler()
    got = s.sample(half, SamplingBatch.from_requests(reqs, V), pos)
    want = s.sample(up, SamplingBatch.from_requests(reqs, V), pos)
    for i, r in enumerate(reqs):
        assert row_bits_equal(got, i, sample_alone(s, up[i], r, int(pos[i]), V)), i
        assert row_bits_equal(got, i, sample_alone(s, half[i], r, int(pos[i]), V)), i
    assert torch.equal(got.token_ids, want.token_ids)
    lp = s.compute_logprobs(half, SamplingBatch.from_requests(reqs, V), got.token_ids)
    assert torch.equal(lp.view(torch.int32), want.logprobs.view(torch.int32))


def test_half_precision_logits_are_never_modified():
    x = torch.randn(3, V).to(torch.bfloat16)
    before = x.clone()
    Sampler().sample(x, _batch([SamplingParams(temperature=0.7, top_p=0.8)] * 3), torch.arange(3))
    assert torch.equal(x.view(torch.int16), before.view(torch.int16))


LOGPROB_MODES = ["raw", "scaled", "processed", "processed_fixed"]


def test_every_logprob_goes_through_the_one_log_softmax(monkeypatch):
    """Bug pinned: the sampled token's logprob called ``torch.log_softmax`` in the
    Sampler while top logprobs went through ``ops.logprobs``, so a kernel swapped in one
    place changed only half of the outputs. With ``ops.logprobs.log_softmax`` replaced by
    a shifted one, every finite logprob moves: the sampled token's, the top-n and the
    rescoring path's, in every mode (greedy "processed" rows are the constant one-hot
    distribution, which no log_softmax computes; they are left out)."""
    from detsample.ops import logprobs as lp_ops

    ps = [
        SamplingParams(temperature=t, top_p=tp, top_k=k, logprobs=3, logprobs_mode=m, seed=i)
        for i, (m, t, tp, k) in enumerate(
            (m, t, tp, k) for m in LOGPROB_MODES for t in (0.0, 0.8) for tp, k in ((1.0, -1), (0.9, -1), (1.0, 5))
        )
    ]
    x = torch.from_numpy(logits_rows(np.random.default_rng(0), len(ps), V, "random"))
    pos = torch.arange(len(ps))
    s = Sampler()

    def run():
        out = s.sample(x, _batch(ps), pos)
        return out, s.compute_logprobs(x, _batch(ps), out.token_ids)

    base, base_lp = run()
    real = lp_ops.log_softmax
    monkeypatch.setattr(lp_ops, "log_softmax", lambda *a, **kw: real(*a, **kw) - 0.25)
    moved, moved_lp = run()
    assert torch.equal(moved.token_ids, base.token_ids)  # the draw never reads logprobs
    constant = torch.tensor([p.logprobs_mode.startswith("processed") and p.is_greedy for p in ps])
    for a, b in ((base.logprobs, moved.logprobs), (base_lp, moved_lp)):
        assert bool((a != b)[~constant].all())
    top_a, top_b = base.top_logprobs[0], moved.top_logprobs[0]
    finite = torch.isfinite(top_a) & ~constant.unsqueeze(1)
    assert bool(finite.any()) and bool((top_a != top_b)[finite].all())


HOMOGENEOUS = {  # one batch-wide configuration each: one table for every row, in order
    "greedy": dict(temperature=0.0),
    "greedy processed": dict(temperature=0.0, logprobs=2, logprobs_mode="processed"),
    "temperature only": dict(temperature=0.8),
    "temperature scaled": dict(temperature=0.8, logprobs=3, logprobs_mode="scaled"),
    "top-k + top-p": dict(temperature=0.8, top_k=20, top_p=0.9),
    "top-p only": dict(temperature=0.8, top_p=0.9, logprobs_mode="processed"),
    "min-p": dict(temperature=0.8, min_p=0.1),
    "large top-k": dict(temperature=1.1, top_k=900),
}
DISRUPTORS = [
    SamplingParams(temperature=0.0, seed=91),
    SamplingParams(top_k=3, seed=92),
    SamplingParams(temperature=1.3, top_p=0.5, seed=93, logprobs=1, logprobs_mode="processed"),
    SamplingParams(temperature=0.7, seed=94),
    SamplingParams(min_p=0.2, seed=95),
]


@pytest.mark.parametrize("name", sorted(HOMOGENEOUS))
def test_homogeneous_batches_equal_their_rows_in_a_mixed_batch(name):
    """A batch where every row has the same configuration skips work (no row gathers or
    scatters, one CDF table drawn directly; all greedy: no masking pass when every row
    is valid); each of its rows gets the bits that the same row gets inside a mixed
    batch (other strategies, a fully masked row, a NaN row)."""
    Vh = 1000
    rng = np.random.default_rng(11)
    ps = [SamplingParams(seed=i, **HOMOGENEOUS[name]) for i in range(6)]
    x = torch.from_numpy(logits_rows(rng, 6, Vh, "peaked"))
    pos = torch.arange(6) + 40
    s = Sampler()
    homo = s.sample(x, _batch(ps, Vh), pos)
    extra = torch.from_numpy(logits_rows(rng, len(DISRUPTORS), Vh, "random"))
    extra[1] = float("-inf")
    extra[3, 5] = float("nan")
    order = [0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5]
    xm = torch.cat([x, extra])[order]
    pm = ps + DISRUPTORS
    pm = [pm[i] for i in order]
    posm = torch.cat([pos, torch.arange(len(DISRUPTORS))])[order]
    mixed = s.sample(xm, _batch(pm, Vh), posm)
    for i in range(6):
        j = order.index(i)
        alone_like = s.sample(x[i : i + 1], _batch([ps[i]], Vh), pos[i : i + 1])
        assert row_bits_equal(homo, i, alone_like), (name, i)
        assert row_bits_equal(mixed, j, alone_like), (name, i)
    lp = s.compute_logprobs(x, _batch(ps, Vh), homo.token_ids)
    assert torch.equal(lp.view(torch.int32), homo.logprobs.view(torch.int32))


LONG_V = 16384  # a vocabulary-sized row for the CPU argmax


@pytest.mark.parametrize("family", ["random", "ties", "nan", "huge", "neginf", "bf16"])
def test_greedy_rows_of_a_long_vocabulary_take_torch_argmax(family):
    """Greedy rows of a vocabulary-sized row (the CPU argmax is numpy's): in an all-greedy
    batch (the shortcut, or the general path when a row is invalid) and next to a
    sampling row (the general path), each row's token is ``torch.argmax`` of its
    sanitised logits and its logprob the one log_softmax's, bit for bit."""
    from detsample.ops.sanitize import sanitize_rows_flagged

    rng = np.random.default_rng(5)
    x = torch.from_numpy(logits_rows(rng, 4, LONG_V, family))
    clean = sanitize_rows_flagged(x)[0]
    want_tok = torch.argmax(clean, dim=-1)
    want_lp = arith.log_softmax(clean).gather(1, want_tok[:, None]).squeeze(1)
    valid = torch.isfinite(clean.amax(-1))
    greedy = [SamplingParams(temperature=0.0, seed=i) for i in range(4)]
    s = Sampler()
    pos = torch.arange(5)
    alone = s.sample(x, _batch(greedy, LONG_V), pos[:4])
    mixed = s.sample(
        torch.cat([x, x[:1]]), _batch(greedy + [SamplingParams(temperature=0.9, top_k=5, seed=9)], LONG_V), pos
    )
    for out in (alone, mixed):
        assert torch.equal(out.token_ids[:4][valid], want_tok[valid])
        assert torch.equal(out.logprobs[:4][valid].view(torch.int32), want_lp[valid].view(torch.int32))
        assert torch.equal(out.token_ids[:4], alone.token_ids)
        assert torch.equal(out.logprobs[:4].view(torch.int32), alone.logprobs.view(torch.int32))


TOP_K_ROWS = [
    dict(temperature=0.8, top_k=20, top_p=0.9),
    dict(temperature=1.2, top_k=5),
    dict(temperature=0.5, top_k=12, min_p=0.1, logprobs=3),
    dict(temperature=0.9, top_k=8, top_p=0.3, min_p=0.05),
    dict(temperature=0.7, top_k=20, top_p=1.0),
    dict(temperature=2.0, top_k=3),
]
SHORTCUT_FAMILIES = FAMILIES + ["zeros", "spill", "overflow"]


def _homogeneous_logits(rng, family, B, V):
    if family == "overflow":  # finite, but x - max overflows to -inf
        return torch.from_numpy(rng.uniform(-3.4e38, 3.4e38, (B, V)).astype(np.float32))
    if family == "zeros":  # the row maximum is 0 with both signs present
        x = -np.abs(logits_rows(rng, B, V, "random"))
        x[:, [5, 300]] = -0.0
        x[:, 200] = 0.0
        return torch.from_numpy(x)
    if family == "spill":  # a tie group straddles every row's candidate bound
        x = logits_rows(rng, B, V, "random")
        x[:, :40] = 50.0
        return torch.from_numpy(x)
    return torch.from_numpy(logits_rows(rng, B, V, family))


@pytest.mark.parametrize("family", SHORTCUT_FAMILIES)
def test_a_batch_of_small_top_k_rows_equals_its_rows_alone(family):
    """A batch where every row has a small top-k (any top-p / min-p, "raw" logprobs) is
    decided by one table for every row; each row gets the bits it gets alone and inside
    a batch with a greedy neighbour, and ``compute_logprobs`` agrees, invalid rows (NaN,
    +inf, all -inf), tie groups spilling past the candidates, zero maxima of both signs
    and overflowing differences included. Bug it would catch: a row maximum that let a
    NaN row through, or a zero maximum of the other sign changing a bit."""
    _check_homogeneous(family, TOP_K_ROWS, 9)


PLAIN_ROWS = [
    dict(temperature=0.8),
    dict(temperature=1.3, logprobs=2),
    dict(temperature=0.6, min_p=0.1),
    dict(temperature=2.0, min_p=0.3, logprobs=1),
    dict(temperature=0.05),
]


@pytest.mark.parametrize("family", SHORTCUT_FAMILIES)
@pytest.mark.parametrize("rows", [1, 3, 7])
def test_a_batch_of_temperature_only_rows_equals_its_rows_alone(family, rows):
    """A batch where every row samples with a temperature and no top-k / top-p (min-p
    allowed, "raw" logprobs) is drawn from one blocked table for every row; each row
    gets the bits it gets alone and inside a mixed batch, invalid rows included. Bug it
    would catch: a batch that drew a NaN row, or lost the min-p cut when only some rows
    use it."""
    _check_homogeneous(family, PLAIN_ROWS, rows)


def _check_homogeneous(family, configs, rows):
    Vs = 1000
    rng = np.random.default_rng(21)
    ps = [SamplingParams(seed=i, **configs[i % len(configs)]) for i in range(rows)]
    x = _homogeneous_logits(rng, family, len(ps), Vs)
    pos = torch.arange(len(ps)) + 7
    s = Sampler()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no floating-point warning escapes to the user
        homo = s.sample(x, _batch(ps, Vs), pos)
    mixed = s.sample(
        torch.cat([x, x[:1]]), _batch(ps + [SamplingParams(temperature=0.0, seed=99)], Vs), torch.cat([pos, pos[:1]])
    )
    for i in range(len(ps)):
        assert row_bits_equal(mixed, i, s.sample(x[i : i + 1], _batch([ps[i]], Vs), pos[i : i + 1])), (family, i)
        assert row_bits_equal(homo, i, s.sample(x[i : i + 1], _batch([ps[i]], Vs), pos[i : i + 1])), (family, i)
    lp = s.compute_logprobs(x, _batch(ps, Vs), homo.token_ids)
    assert torch.equal(lp.view(torch.int32), homo.logprobs.view(torch.int32))


@pytest.mark.parametrize("params", [dict(temperature=0.0), dict(temperature=0.8, top_k=20)])
def test_logits_that_require_grad_give_the_same_bits_and_no_graph(params):
    """The homogeneous shortcuts skip the no_grad context only when no input requires
    grad; logits from a training model (``requires_grad``) take the general path under
    no_grad: the same bits, and nothing in the output holds a graph."""
    x = torch.from_numpy(logits_rows(np.random.default_rng(2), 3, 500, "peaked"))
    ps = [SamplingParams(seed=i, **params) for i in range(3)]
    plain = Sampler().sample(x, _batch(ps, 500), torch.arange(3))
    graded = Sampler().sample(x.clone().requires_grad_(True), _batch(ps, 500), torch.arange(3))
    assert torch.equal(plain.token_ids, graded.token_ids)
    assert torch.equal(plain.logprobs.view(torch.int32), graded.logprobs.view(torch.int32))
    assert not graded.logprobs.requires_grad
