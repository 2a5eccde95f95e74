"""A model the project never saw, run tensor-parallel on gloo ranks: TP=1's bits or a named failure.

Under ``batch_invariant(portable=True)`` the sharded model's logits (prefill, padded
batch, decode), the sampler's outputs on vocab-sharded logits and a TP=2 rollout equal
TP=1 bitwise, and the rollout audits exact 1.0 against a TP=1 trainer and vice versa
(TPRescorer); with torch's default kernels the ``tensor_parallel`` check fails and names
the row-parallel combine (the negative control). Small models and sizes: every group is a
few processes on a 2-core machine.
"""

from __future__ import annotations

import pytest
import torch

from detsample import Request, Sampler, SamplingBatch, SamplingParams
from detsample.audit import audit
from detsample.audit.running.rescore import ModelRescorer, TPRescorer
from detsample.audit.running.rollout import Ending, _rank_rollouts, generate_rollouts
from detsample.audit.semantics import RAW
from detsample.models import load_model
from detsample.parallel import TPModelSpec, tp_group
from detsample.parallel.sampling import compute_logprobs_sharded, sample_sharded
from detsample.probe.parallel import ROW_PARALLEL_OP, check_tensor_parallel, forwards, job_forwards
from tests.parallel import models
from tests.parallel.tp import CFG, START

RUN = dict(
    num_sequences=3,
    max_new_tokens=5,
    seed=7,
    sampling=SamplingParams(seed=0, top_p=0.9),
    max_batch_size=2,
    stagger=1,
    with_trainer=True,
)
#: RUN as generate_rollouts hands it to each rank (built prompts, one sample each, raw logprobs)
RANK_RUN = dict(RUN, prompts=None, n=1, semantics=RAW, ending=Ending())
V = 512


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.fixture(scope="module")
def reference():
    return load_model(models.UNSEEN, batch_invariant=True, portable=True)


@pytest.fixture(scope="module")
def group2():
    with tp_group(TPModelSpec(models.UNSEEN, 2, True, True), timeout=180, start_method=START) as g:
        yield g


@pytest.fixture(scope="module")
def group4():
    with tp_group(TPModelSpec(models.UNSEEN, 4, True, True), timeout=180, start_method=START) as g:
        yield g


# -- the sampler on vocab-sharded logits (a rank job: importable by name) --------------


def _batch():
    rows = [
        SamplingParams(temperature=0.0, logprobs=3),
        SamplingParams(temperature=0.8, top_k=40, seed=3, logprobs=5),
        SamplingParams(temperature=1.0, top_p=0.7, seed=4, logprobs=2, logprobs_mode="processed"),
        SamplingParams(temperature=1.3, min_p=0.05, seed=5, repetition_penalty=1.2, logprobs=1, logprobs_mode="scaled"),
    ]
    reqs = [Request(f"r{i}", p, [1, 2, 3 + i], [4, 5]) for i, p in enumerate(rows)]
    return SamplingBatch.from_requests(reqs, vocab_size=V)


def _logits(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, V, generator=g) * 3
    x[0, 17] = x[0, 301] = x[0].max() + 1  # a greedy tie across two ranks' shards
    return x


def _sample(logits: torch.Tensor, shard_of=None):
    batch, sampler = _batch(), Sampler()
    positions = torch.tensor([3, 4, 5, 6])
    if shard_of is None:
        out = sampler.sample(logits, batch, positions)
        lp = sampler.compute_logprobs(logits, batch, out.token_ids)
    else:
        out = sample_sharded(sampler, shard_of(logits), batch, positions, shard_of.comm)
        lp = compute_logprobs_sharded(sampler, shard_of(logits), batch, out.token_ids, shard_of.comm)
    return {
        "tokens": out.token_ids,
        "logprobs": out.logprobs,
        "top": out.top_logprobs[0],
        "top_ids": out.top_logprobs[1],
        "rescored": lp,
    }


class _Shard:
    def __init__(self, comm):
        self.comm = comm

    def __call__(self, x):
        n = x.shape[1] // self.comm.world
        return x[:, self.comm.rank * n : (self.comm.rank + 1) * n]


def job_sample(lm, comm, seed):
    return _sample(_logits(seed), _Shard(comm))


def job_fail_on_rank1(lm, comm):
    if comm.rank == 1:
        raise ValueError("rank 1 refuses")


# -- TP = 2 and 4 vs TP = 1 -------------------------------------------------------------


@pytest.mark.parametrize("tp", [2, 4])
def test_logits_equal_tp1_bitwise(tp, reference, request):
    group = request.getfixturevalue(f"group{tp}")
    got, want = group.call(job_forwards, CFG), forwards(reference, CFG)
    for part in ("prefill", "batch", "decode"):
        assert torch.equal(_bits(got[part]), _bits(want[part])), (tp, part)


@pytest.mark.parametrize("tp", [2, 4])
def test_sampling_on_sharded_logits_equals_single_rank(tp, request):
    group = request.getfixturevalue(f"group{tp}")
    got, want = group.call(job_sample, 11), _sample(_logits(11))
    for k in want:
        assert torch.equal(got[k], want[k]), (tp, k)
    assert int(want["tokens"][0]) == 17  # the tie went to the lowest id, in rank 0's shard


def test_tp2_rollout_equals_tp1_and_audits_exact_against_tp1(group2):
    tp2 = group2.call(_rank_rollouts, RANK_RUN)
    tp1 = generate_rollouts(**RUN, model=models.UNSEEN, batch_invariant=True, portable=True)
    assert [r["response_ids"] for r in tp2] == [r["response_ids"] for r in tp1]
    assert [r["engine_logprobs"] for r in tp2] == [r["engine_logprobs"] for r in tp1]
    # the TP=2 trainer (prefill on the ranks) scores the TP=1 engine's tokens to the bit
    assert [r["trainer_logprobs"] for r in tp2] == [r["engine_logprobs"] for r in tp1]
    engine_only = [{k: v for k, v in r.items() if k != "trainer_logprobs"} for r in tp2]
    rep = audit(engine_only, rescore=ModelRescorer(models.UNSEEN, batch_invariant=True, portable=True))
    assert rep["exact_match_fraction"] == 1.0 and rep["max_abs_diff"] == 0.0


def test_tp1_rollout_audits_exact_against_a_tp2_trainer():
    records = generate_rollouts(
        **{**RUN, "with_trainer": False}, model=models.UNSEEN, batch_invariant=True, portable=True
    )
    rescorer = TPRescorer(models.UNSEEN, 2, batch_invariant=True, portable=True, start_method=START)
    try:
        rep = audit(records, rescore=rescorer)
    finally:
        rescorer.close()
    assert rep["exact_match_fraction"] == 1.0 and rep["max_abs_diff"] == 0.0


def test_an_error_in_a_rank_is_named(group4):  # last user of group4: the error closes it
    from detsample.parallel import RankError

    with pytest.raises(
        RankError,
        match=r"rank 1 of 4 raised ValueError during job_fail_on_rank1: "
        r"rank 1 refuses",
    ) as e:
        group4.call(job_fail_on_rank1)
    assert e.value.kind == "ValueError" and e.value.rank == 1


def test_negative_control_default_kernels_fail_and_name_the_row_parallel_combine():
    ref = load_model(models.UNSEEN)
    check = check_tensor_parallel(ref, models.UNSEEN, [1, 2], config=CFG, timeout=180, start_method=START)
    assert check.name == "tensor_parallel" and not check.ok
    assert "TP=2: prefill logits differ" in check.detail
    div = check.first_divergence
    assert div is not None and div.module.endswith(("o_proj", "down_proj")), div
    assert div.op == ROW_PARALLEL_OP and div.max_ulp > 0


@pytest.mark.tp_full
@pytest.mark.parametrize(
    "model, tp",
    [
        (models.QWEN2, 2),
        (models.QWEN2, 4),
        (models.BIASED, 2),
        (models.BIASED, 4),
        (models.BIASED_BF16, 2),
        (models.BIASED_BF16, 4),
    ],
)
def test_more_models_pass_the_check(model, tp):
    ref = load_model(model, batch_invariant=True, portable=True)
    check = check_tensor_parallel(
        ref, model, [tp], batch_invariant=True, portable=True, config=CFG, timeout=300, start_method=START
    )
    assert check.ok, check.detail


@pytest.mark.tp8
def test_tp8_gives_tp1_bits():
    ref = load_model(models.WIDE8, batch_invariant=True, portable=True)
    check = check_tensor_parallel(
        ref, models.WIDE8, [1, 8], batch_invariant=True, portable=True, config=CFG, timeout=600, start_method=START
    )
    assert check.ok, check.detail
