"""Mixture-of-experts models tensor-parallel: experts placed on ranks, TP=1's bits.

Qwen3-MoE and Mixtral (8 experts, 3 a token: with 2 a token every order of the sum gives
the same bits, so the combine's order would go untested), routed by a replicated router,
the experts' outputs exchanged exactly and combined with the ops of TP=1's experts
implementation (``grouped_mm``, ``batched_mm``). The negative control: a
plain expert-parallel combine (each rank's partial sums added by a floating-point
all-reduce), run under the same mode, gives other bits.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.models import load_model
from detsample.parallel import TensorParallelError, plan
from detsample.parallel.experts import ExpertParallel, expert_range
from detsample.probe.parallel import check_tensor_parallel, forwards
from tests.parallel import models
from tests.parallel.tp import CFG, START, assert_bitwise, bits, tp_runs


@pytest.mark.parametrize(
    "experts, world, blocks",
    [
        (8, 2, [range(0, 4), range(4, 8)]),
        (8, 4, [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]),
        (3, 4, [range(0, 0), range(0, 1), range(1, 2), range(2, 3)]),  # a rank may hold none
    ],
)
def test_experts_are_placed_in_contiguous_blocks_covering_each_once(experts, world, blocks):
    got = [expert_range(r, experts, world) for r in range(world)]
    assert got == blocks
    assert sorted(e for b in got for e in b) == list(range(experts))


def job_plain_combine(lm, comm, cfg):
    """The forwards with every MoE layer's combine replaced by a plain expert-parallel one
    (rank partial sums, floating-point all-reduce), under the same portable mode."""
    for m in lm.module.modules():
        if isinstance(m, ExpertParallel):
            m.forward = m.plain
    return forwards(lm, cfg)


def test_tp2_qwen3_moe_equals_tp1_bitwise_and_a_plain_combine_does_not():
    want, got, plain = tp_runs(models.QWEN3_MOE, 2, job_plain_combine, CFG)
    assert_bitwise(got, want)
    assert not torch.equal(bits(plain["prefill"]), bits(want["prefill"]))


def test_tp2_qwen2_moe_with_a_gated_shared_expert_equals_tp1_bitwise():
    """The bug: Qwen2-MoE was refused for its shared expert's sigmoid gate; the gate (a
    hidden -> 1 linear) is replicated, the shared expert a dense MLP split as any."""
    want, got, plain = tp_runs(models.QWEN2_MOE, 2, job_plain_combine, CFG)
    assert_bitwise(got, want)
    assert not torch.equal(bits(plain["prefill"]), bits(want["prefill"]))


def test_moe_layout_holds_experts_not_split():
    lay = plan(models.mixtral(), 4)
    assert (lay.experts, lay.intermediate, lay.heads) == (8, 0, 1)


def test_eager_experts_are_refused_by_name():
    m = models.mixtral()
    m.config._experts_implementation = "eager"
    with pytest.raises(
        TensorParallelError,
        match=r"model.layers.0.mlp.experts runs experts_implementation "
        r"'eager'; expert parallelism repeats the combine of "
        r"grouped_mm, batched_mm",
    ):
        plan(m, 2)


def test_an_moe_block_with_other_modules_is_refused_by_name():
    m = models.qwen3_moe()
    m.model.layers[1].mlp.extra_gate = torch.nn.Linear(64, 1)
    with pytest.raises(
        TensorParallelError,
        match=r"model.layers.1.mlp \(Qwen3MoeSparseMoeBlock\) has "
        r"modules extra_gate",
    ):
        plan(m, 2)


@pytest.mark.tp_full
@pytest.mark.parametrize(
    "model, tp",
    [
        (models.QWEN3_MOE, 4),
        (models.MIXTRAL, 2),
        (models.MIXTRAL, 4),
        (models.MIXTRAL_BATCHED, 2),
        (models.MIXTRAL_BATCHED, 4),
    ],
)
def test_more_moe_models_pass_the_check(model, tp):
    ref = load_model(model, batch_invariant=True, portable=True)
    check = check_tensor_parallel(
        ref, model, [tp], batch_invariant=True, portable=True, config=CFG, timeout=300, start_method=START
    )
    assert check.ok, check.detail


# -- in one process: the combine is transformers' own, op for op ------------------------


@functools.cache
def _mixtral(impl: str):
    model = models.mixtral()
    model.config._experts_implementation = impl
    return model


def _one_rank(impl: str, t: int, seed: int, roll: bool = False):
    """(TP=1's experts output, ExpertParallel's on one rank) for ``t`` random tokens;
    ``roll``: the latter sums each token's slots rotated by one (a wrong combine: the
    mode's fixed tree adds slots 0 and 2 first, so a reversal would be the same sum)."""
    from detsample.invariant import batch_invariant
    from detsample.parallel import Comm

    model = _mixtral(impl)
    block = model.model.layers[0].mlp
    x = torch.randn(t, model.config.hidden_size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad(), batch_invariant(portable=True):
        _, weights, index = block.gate(x)
        want = block.experts(x, index, weights)
        if roll:
            index, weights = index.roll(1, -1), weights.roll(1, -1)
        return want, ExpertParallel(block.experts, Comm.single()).exact(x, index, weights)


@pytest.mark.parametrize("impl", ["grouped_mm", "batched_mm"])
@settings(max_examples=3, deadline=None)
@given(t=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_one_rank_expert_parallel_equals_transformers_experts_bitwise(impl, t, seed):
    want, got = _one_rank(impl, t, seed)
    assert torch.equal(bits(got), bits(want))


def test_negative_control_slots_summed_in_another_order_differ():
    want, got = _one_rank("grouped_mm", 32, 0, roll=True)
    assert not torch.equal(bits(got), bits(want))
