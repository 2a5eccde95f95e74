"""DeepSeek-V3's multi-head latent attention tensor-parallel: heads split, latent replicated.

The tiny DeepSeek-V3 (q LoRA 32, KV LoRA 16, qk 16 + 8 rope, v 16, interleaved rope; a dense
first layer, then MoE with a sigmoid router, grouped top-k and a shared expert) at TP=2 gives
TP=1's bits under the portable mode. The negative control: the same shards with two heads'
rows of ``kv_b_proj`` swapped on every rank (a head cut out of its place in the
``[k_nope; v]``-per-head layout) give other bits.
"""

from __future__ import annotations

import pytest
import torch

from detsample.models import load_model
from detsample.parallel import plan
from detsample.probe.parallel import check_tensor_parallel, forwards
from tests.parallel import models
from tests.parallel.tp import CFG, START, assert_bitwise, bits, tp_runs


def job_swapped_heads(lm, comm, cfg):
    for layer in lm.module.model.layers:
        att = layer.self_attn
        w = att.kv_b_proj.weight
        with torch.no_grad():
            w.copy_(w.view(att.num_heads, -1, w.shape[1]).flip(0).reshape(w.shape))
    return forwards(lm, cfg)


def test_mla_layout():
    lay = plan(models.deepseek_v3(), 2)
    assert (lay.attention, lay.heads, lay.experts, lay.intermediate) == ("mla", 2, 8, 32)


def test_tp2_deepseek_v3_equals_tp1_bitwise_and_swapped_heads_do_not():
    want, got, swapped = tp_runs(models.DEEPSEEK, 2, job_swapped_heads, CFG)
    assert_bitwise(got, want)
    assert not torch.equal(bits(swapped["prefill"]), bits(want["prefill"]))


@pytest.mark.tp_full
def test_tp4_deepseek_v3_passes_the_check():
    reference = load_model(models.DEEPSEEK, batch_invariant=True, portable=True)
    check = check_tensor_parallel(
        reference,
        models.DEEPSEEK,
        [4],
        batch_invariant=True,
        portable=True,
        config=CFG,
        timeout=300,
        start_method=START,
    )
    assert check.ok, check.detail
