"""The "processed" logprobs mode is vLLM's formula: checked against a re-implementation
of vLLM's sampler code path (v1 ``Sampler`` + ``TopKTopPSampler.forward_native`` with
``logprobs_mode="processed_logprobs"``) written here from its logic, on the same logits:
the same kept set exactly, and the same bits when its last step, ``log_softmax``, is
detsample's defined one (vLLM's own is torch's float32 kernel, whose bits are the
platform's: within a few ulps of it, measured below).

vLLM's path: ``logits.div_(temperature)``; min-p (a logits processor, before top-k/top-p):
``softmax``, tokens with ``p < min_p * max p`` to ``-inf``; ``apply_top_k_top_p``: an
ascending sort, the top-k boundary value masked below, ``softmax`` + ``cumsum`` of the
sorted row, ``cumsum <= 1 - top_p`` masked (the last, largest, never), scattered back;
then ``logits.log_softmax(dim=-1)``.

The BUG pinned: detsample's "processed" logprobs used the fixed-point normaliser
(z_i - log(Q 2^-F)), which differs from what vLLM reports by up to 10 ulp, so an audit in
vLLM's semantics could never be exact. That form is now "processed_fixed".
"""

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from detsample import Request, Sampler, SamplingBatch, SamplingParams, arith
from tests.vllm_reference import vllm_processed


def top_p_near_boundary(logits: torch.Tensor, t: float, p: float) -> bool:
    """Whether a float cumsum lies so close to 1 - p that the float and the exact top-p
    rules may keep different sets (a documented boundary, not the formula's bits)."""
    if p == 1.0:
        return False
    probs = torch.softmax(logits.double() / t, -1).sort(dim=-1).values
    cum = probs.cumsum(-1)
    return bool(((cum - (1 - p)).abs() < 1e-5).any())


def detsample_row(logits: torch.Tensor, params: SamplingParams, mode: str) -> torch.Tensor:
    """(V,) the logprob of every token of one row in ``mode``, by the rescoring path."""
    V = logits.shape[1]
    p = params.replace(logprobs_mode=mode)
    batch = SamplingBatch.from_requests([Request(f"r{i}", p, [1], []) for i in range(V)], vocab_size=V)
    return Sampler().compute_logprobs(logits.expand(V, V).contiguous(), batch, torch.arange(V))


SETTINGS = [  # (temperature, top_k, top_p, min_p)
    (0.7, -1, 0.9, 0.0),
    (1.0, -1, 1.0, 0.0),
    (0.6, -1, 1.0, 0.0),
    (1.3, 20, 1.0, 0.0),
    (0.8, 40, 0.95, 0.0),
    (0.9, -1, 1.0, 0.05),
]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), setting=st.sampled_from(SETTINGS), scale=st.sampled_from([1.0, 4.0]))
def test_processed_equals_vllm_bitwise(seed, setting, scale):
    t, k, p, min_p = setting
    V = 96
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn((1, V), generator=g) * scale).to(torch.float32)
    assume(not top_p_near_boundary(logits, t, p))
    params = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=min_p, seed=0)
    ours = detsample_row(logits, params, "processed")
    theirs = vllm_processed(logits, t, k, p, min_p, log_softmax=arith.log_softmax)[0]
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs)), "kept sets differ"
    assert torch.equal(ours, theirs)
    torchs = vllm_processed(logits, t, k, p, min_p)[0]  # vLLM's float32 log_softmax
    kept = torch.isfinite(ours)
    assert torch.equal(kept, torch.isfinite(torchs))
    assert float((ours[kept] - torchs[kept]).abs().max()) <= 2e-6


def test_fixed_point_mode_differs_by_ulps_only():
    """ "processed_fixed" is the same distribution with an exact normaliser: within a few
    ulps of "processed", not bitwise (so the two names are not aliases)."""
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn((1, 512), generator=g) * 3).to(torch.float32)
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=0)
    vllm_like = detsample_row(logits, params, "processed")
    fixed = detsample_row(logits, params, "processed_fixed")
    kept = torch.isfinite(vllm_like)
    assert torch.equal(kept, torch.isfinite(fixed))
    ulp = (vllm_like[kept].view(torch.int32) - fixed[kept].view(torch.int32)).abs()
    assert int(ulp.max()) <= 16
    assert not torch.equal(vllm_like, fixed)


@pytest.mark.parametrize("mode", ["processed", "processed_fixed"])
def test_sampling_path_equals_rescoring_path(mode):
    """Prefill/decode alignment in both processed modes: the logprob ``sample`` reports
    equals ``compute_logprobs`` of the same token, bitwise, alone or in a mixed batch."""
    g = torch.Generator().manual_seed(11)
    V = 300
    logits = (torch.randn((4, V), generator=g) * 3).to(torch.float32)
    ps = [
        SamplingParams(temperature=0.7, top_p=0.9, seed=5, logprobs=3, logprobs_mode=mode),
        SamplingParams(temperature=0.0, seed=6, logprobs_mode=mode),
        SamplingParams(temperature=1.1, top_k=17, seed=7, logprobs_mode="raw"),
        SamplingParams(temperature=0.9, min_p=0.1, seed=8, logprobs=2, logprobs_mode=mode),
    ]
    batch = SamplingBatch.from_requests([Request(str(i), p, [1], []) for i, p in enumerate(ps)], vocab_size=V)
    out = Sampler().sample(logits, batch, torch.zeros(4, dtype=torch.int64))
    again = Sampler().compute_logprobs(logits, batch, out.token_ids)
    assert torch.equal(out.logprobs, again)
    for i in range(4):  # each row alone
        one = SamplingBatch.from_requests([Request("x", ps[i], [1], [])], vocab_size=V)
        alone = Sampler().sample(logits[i : i + 1], one, torch.zeros(1, dtype=torch.int64))
        assert torch.equal(alone.logprobs, out.logprobs[i : i + 1])
    assert out.logprobs[1] == 0.0  # greedy: one-hot
    top_v, top_i = out.top_logprobs
    row = detsample_row(logits[:1], ps[0], mode)
    assert torch.equal(top_v[0], row[top_i[0]])
