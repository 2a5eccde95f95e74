"""Sampler(backend="triton"): the kernel twins of detsample.kernels.sampler_ops, end to end.

On CPU the kernels run in the interpreter worker (tests/kernels/worker.py). Within the
Triton backend every bit is batch-invariant; against the torch backend every output is
the same bits -- tokens, logprobs in every mode, top logprobs and their ids, status --
because both compute detsample.arith's definition (the interpreter rounds float64 and
float32 operations as IEEE, as a GPU does; docs/gpu.md).
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import InvalidSamplingParams, Sampler, SamplingBatch, SamplingParams
from oracles import sampler as osamp
from tests.helpers import logits_rows, params_strategy, requests_from

V = 1000
MIXED = [
    SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=1, logprobs=3),
    SamplingParams(temperature=0.0, logprobs=2, logprobs_mode="processed"),
    SamplingParams(temperature=1.2, top_p=0.7, seed=3, logprobs_mode="processed", logprobs=2),
    SamplingParams(temperature=1.0, min_p=0.05, seed=4, logprobs_mode="scaled", logprobs=4),
    SamplingParams(temperature=1.0, top_k=300, seed=5, logprobs_mode="processed"),
    SamplingParams(temperature=0.7, seed=6, logit_bias={7: 3.0}),
    SamplingParams(temperature=1.5, top_k=2000, top_p=0.95, seed=7, logprobs_mode="scaled"),
    SamplingParams(temperature=0.9, top_k=1, seed=8, logprobs=1),
]


def _outs(out):
    top = out.top_logprobs if out.top_logprobs is not None else (None, None)
    return out.token_ids, out.logprobs, top[0], top[1], out.status


def run_sampler(x, params, positions, alone_rows):
    """The batch through both backends, the Triton one also reversed, alone, sorted and
    rescored, and the "auto" backend (torch on CPU)."""
    vocab = x.shape[1]
    reqs = requests_from(params)

    def batch(rs):
        return SamplingBatch.from_requests(rs, vocab, eos_token_ids=(0,))

    tri, tor = Sampler(backend="triton"), Sampler(backend="torch")
    out = tri.sample(x, batch(reqs), positions)
    res = {
        "triton": _outs(out),
        "torch": _outs(tor.sample(x, batch(reqs), positions)),
        "auto": _outs(Sampler().sample(x, batch(reqs), positions)),
        "sort": _outs(Sampler(backend="triton", filter_impl="sort").sample(x, batch(reqs), positions)),
        "rescore": tri.compute_logprobs(x, batch(reqs), out.token_ids),
        "reversed": _outs(tri.sample(x.flip(0), batch(reqs[::-1]), positions.flip(0))),
        "alone": {i: _outs(tri.sample(x[i : i + 1], batch([reqs[i]]), positions[i : i + 1])) for i in alone_rows},
    }
    return res


def bits(t):
    if t is None:
        return None
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def same(a, b) -> bool:
    return all((x is None and y is None) or torch.equal(bits(x), bits(y)) for x, y in zip(a, b))


def row(outs, i):
    return tuple(None if t is None else t[i : i + 1] for t in outs)


def trim(outs, n):
    """top-logprob columns beyond a row's own request are padding: keep the first n
    (none at all when the row asks none: alone it gets no top-logprobs)."""
    t, lp, tv, ti, st_ = outs
    if tv is None or n == 0:
        return t, lp, None, None, st_
    return t, lp, tv[:, :n], ti[:, :n], st_


def check(interp, x, params, positions, alone_rows):
    res = interp(run_sampler, torch.from_numpy(x), params, positions, alone_rows)
    tri, tor = res["triton"], res["torch"]
    assert same(res["auto"], tor)  # "auto" on CPU tensors is the torch backend
    assert same(res["sort"], tri)  # the full-sort route: same bits
    assert torch.equal(bits(res["rescore"]), bits(tri[1]))  # prefill/decode alignment
    rev = tuple(None if t is None else t.flip(0) for t in res["reversed"])
    assert same(rev, tri)
    for i, alone in res["alone"].items():
        assert same(trim(row(tri, i), params[i].logprobs), alone), (i, params[i])
    for name, a, b in zip(("tokens", "logprobs", "top values", "top ids", "status"), tri, tor):
        assert (a is None and b is None) or torch.equal(bits(a), bits(b)), name
    agree_with_oracle(x, params, positions, tri)


def agree_with_oracle(x, params, positions, outs) -> None:
    """Outputs ``outs`` (token ids, logprobs, ...) are the numpy oracle's token and
    logprob bits on every row (oracles/sampler.py: the defined arithmetic, written
    independently; near-ties included)."""
    for i, p in enumerate(params):
        r = osamp.sample_row(
            x[i],
            osamp.RowParams(
                temperature=p.temperature,
                top_k=p.top_k,
                top_p=p.top_p,
                min_p=p.min_p,
                logit_bias=dict(p.logit_bias or ()),
                seed=p.seed,
                logprobs_mode=p.logprobs_mode,
            ),
            int(positions[i]),
        )
        assert int(outs[0][i]) == r.token, (i, p)
        want = torch.tensor([r.logprob], dtype=torch.float32)
        assert torch.equal(bits(outs[1][i : i + 1].cpu()), bits(want)), (i, p, outs[1][i], r.logprob)


def test_mixed_batch_against_torch_backend_and_alone(interp):
    """Every route, every logprobs mode, greedy and biased rows in one batch. Bugs it
    pins: a backend switch that changes a row's bits with its neighbours, a rescoring
    path that disagrees with the sampling path, or a Triton step with other semantics
    than its torch twin (the tokens of rows away from near-ties would differ)."""
    rng = np.random.default_rng(0)
    x = logits_rows(rng, len(MIXED), V, "random")
    positions = torch.arange(len(MIXED)) * 7 + 11
    check(interp, x, MIXED, positions, alone_rows=[0, 2, 5])


@pytest.mark.triton_full
@settings(max_examples=20)
@given(
    st.lists(params_strategy(300), min_size=1, max_size=8),
    st.sampled_from(["random", "ties", "neginf", "nan", "onehot", "mixed"]),
    st.integers(0, 2**32 - 1),
)
def test_property_against_torch_backend_and_alone(interp, params, family, seed):
    rng = np.random.default_rng(seed)
    x = logits_rows(rng, len(params), 300, family)
    positions = torch.from_numpy(rng.integers(0, 10_000, len(params)))
    check(interp, x, params, positions, alone_rows=list(range(len(params))))


@pytest.mark.parametrize("backend", ["cuda", "Triton", "", None, 1])
def test_backend_is_validated(backend):
    with pytest.raises(InvalidSamplingParams, match="backend must be one of"):
        Sampler(backend=backend)


def test_triton_on_cpu_without_interpreter_is_a_clear_error():
    """Without TRITON_INTERPRET=1 (this pytest process never sets it) the kernels cannot
    run on CPU tensors: the error names the backend, the device and the way out."""
    pytest.importorskip("triton")
    from detsample.kernels.common import interpreted

    if interpreted():
        pytest.skip("this process itself runs under the Triton interpreter")
    b = SamplingBatch.from_requests(requests_from([SamplingParams(seed=1)]), 8)
    with pytest.raises(InvalidSamplingParams) as e:
        Sampler(backend="triton").sample(torch.zeros(1, 8), b, torch.tensor([0]))
    msg = str(e.value)
    assert "backend='triton'" in msg and "TRITON_INTERPRET=1" in msg and "'cpu'" in msg


@pytest.mark.gpu
def test_cuda_gives_the_cpus_bits(cuda):
    """On the GPU: "auto" picks Triton; every output (tokens, logprobs, top logprobs and
    their ids, status) is the CPU torch backend's bits, row by row, at B = 64 and
    V = 32000 over every route and logprobs mode; a row alone == in the batch;
    run-to-run. The aim of the defined arithmetic, checkable only here."""
    rng = np.random.default_rng(5)
    B, vocab = 64, 32000
    params = [MIXED[i % len(MIXED)] for i in range(B)]
    reqs = requests_from(params)
    for family in ("random", "mixed"):
        x = logits_rows(rng, B, vocab, family)
        positions = torch.arange(B) + 100
        gpu = Sampler().sample(
            torch.from_numpy(x).to(cuda), SamplingBatch.from_requests(reqs, vocab, device=cuda), positions
        )
        cpu = Sampler().sample(torch.from_numpy(x), SamplingBatch.from_requests(reqs, vocab), positions)
        again = Sampler().sample(
            torch.from_numpy(x).to(cuda), SamplingBatch.from_requests(reqs, vocab, device=cuda), positions
        )
        on_gpu = tuple(None if t is None else t.cpu() for t in _outs(gpu))
        assert same(on_gpu, _outs(cpu)), family
        assert same(tuple(None if t is None else t.cpu() for t in _outs(again)), on_gpu)
        for i in range(0, B, 9):
            alone = Sampler().sample(
                torch.from_numpy(x[i : i + 1]).to(cuda),
                SamplingBatch.from_requests([reqs[i]], vocab, device=cuda),
                positions[i : i + 1],
            )
            assert torch.equal(alone.token_ids.cpu(), gpu.token_ids[i : i + 1].cpu())
            assert torch.equal(bits(alone.logprobs.cpu()), bits(gpu.logprobs[i : i + 1].cpu()))
