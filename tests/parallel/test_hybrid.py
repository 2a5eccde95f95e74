"""A hybrid tensor-parallel: a Qwen3.5-style model's gated delta-net heads and gated attention
heads split over the ranks, TP=1's bits.

The tiny Qwen3.5 (a gated delta-net layer of 4 key / 8 value heads, a gated attention layer
of 4 heads / 2 KV heads) at TP=2 and TP=4 gives TP=1's bits under the portable mode:
prefill, a row among padded neighbours, decode (each rank's recurrent states and
convolution windows its heads' slice of TP=1's). The negative control: the same shards with
each rank's q and k blocks of ``in_proj_qkv`` (and the convolution's channels) swapped (a
block cut out of its place) give other bits. A Mamba 2 hybrid (Nemotron-H: a Mamba 2 mixer
split by groups of heads, an attention, ungated MLPs) at TP=2 and TP=4 gives TP=1's bits
too; its negative control swaps each rank's B and C blocks. A TP size that does not divide
the mixer's groups is refused by name before any rank starts.

Pins: a split that cut the q / k / v blocks of ``in_proj_qkv`` (or the convolution's
channels) out of their places; a gated attention's query and gate rows cut as a plain
query's (``2 x head_dim`` per head); a Mamba 2 mixer cut across a group (its heads share
B and C).
"""

from __future__ import annotations

import pytest
import torch

from detsample.parallel import TPModelSpec, plan
from detsample.parallel.layers import TensorParallelError
from detsample.parallel.runner import check_spec
from detsample.probe.parallel import forwards
from tests.parallel import models
from tests.parallel.tp import CFG, assert_bitwise, bits, tp_runs


def job_swapped_query_and_key(lm, comm, cfg):
    """Swap this rank's q and k blocks of ``in_proj_qkv`` (and of the convolution's
    channels), then the probe's forwards."""
    for layer in lm.module.model.layers:
        gdn = getattr(layer, "linear_attn", None)
        if gdn is None:
            continue
        n = gdn.key_dim
        order = torch.cat([torch.arange(n, 2 * n), torch.arange(n), torch.arange(2 * n, gdn.conv_dim)])
        with torch.no_grad():
            gdn.in_proj_qkv.weight.copy_(gdn.in_proj_qkv.weight[order])
            gdn.conv1d.weight.copy_(gdn.conv1d.weight[order])
    return forwards(lm, cfg)


def test_the_qwen35_layout_splits_the_linear_attention_by_key_heads():
    lay = plan(models.qwen35_hybrid(), 4)
    assert (lay.attention, lay.heads, lay.kv_heads, lay.kv_repeat) == ("gated", 1, 1, 2)
    with pytest.raises(
        TensorParallelError,
        match=r"tp=4 does not divide the linear_num_key_heads=2 "
        r"of model.layers.0.linear_attn",
    ):
        plan(models.qwen35_hybrid(key_heads=2), 4)


def job_swapped_b_and_c(lm, comm, cfg):
    """Swap this rank's B and C blocks of every Mamba 2 mixer's ``in_proj`` (and of its
    convolution's channels), then the probe's forwards."""
    for layer in lm.module.model.layers:
        if not hasattr(getattr(layer, "mixer", None), "A_log"):
            continue
        m = layer.mixer
        inner, gn = m.intermediate_size, m.n_groups * m.ssm_state_size
        conv = torch.cat(
            [torch.arange(inner), torch.arange(inner + gn, inner + 2 * gn), torch.arange(inner, inner + gn)]
        )
        rows = torch.cat([torch.arange(inner), inner + conv, torch.arange(inner + m.conv_dim, m.in_proj.out_features)])
        with torch.no_grad():
            m.in_proj.weight.copy_(m.in_proj.weight[rows])
            m.conv1d.weight.copy_(m.conv1d.weight[conv])
            m.conv1d.bias.copy_(m.conv1d.bias[conv])
    return forwards(lm, cfg)


def test_the_nemotron_h_layout_splits_the_mamba2_mixer_by_groups():
    lay = plan(models.nemotron_h(), 4)
    assert (lay.attention, lay.heads, lay.intermediate) == ("gqa", 1, 24)
    with pytest.raises(
        TensorParallelError,
        match=r"tp=4 does not divide the n_groups=2 of "
        r"model.layers.0.mixer",
    ):
        plan(models.nemotron_h(groups=2), 4)


@pytest.mark.parametrize(
    "spec, control",
    [(models.QWEN35, job_swapped_query_and_key), (models.NEMOTRON_H, job_swapped_b_and_c)],
    ids=["qwen35", "nemotron-h"],
)
@pytest.mark.parametrize("tp", [2, 4])
def test_tp_hybrid_equals_tp1_bitwise_and_a_misplaced_block_does_not(spec, control, tp):
    want, got, misplaced = tp_runs(spec, tp, control, CFG)
    assert_bitwise(got, want)
    assert not torch.equal(bits(misplaced["prefill"]), bits(want["prefill"]))


def test_qwen3_next_is_refused_by_name_with_why():
    with pytest.raises(TensorParallelError, match="'qwen3_next'.*packs q, k, v and z per key head"):
        plan(models.qwen3_next(), 2)


def test_a_nemotron_h_split_is_refused_before_the_ranks_start():
    with pytest.raises(TensorParallelError, match="does not divide the n_groups=2"):
        check_spec(TPModelSpec("tests.parallel.models:nemotron_h_two_groups", 4, True, True))
