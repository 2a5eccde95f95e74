"""The Megatron layout: how a model splits, and every refusal named (no process started)."""

from __future__ import annotations

import pytest
import torch

from detsample.models import load_model
from detsample.models.tiny import build_tiny
from detsample.parallel import TensorParallelError, TPModelSpec, plan
from detsample.parallel.layers import VERIFIED_REFUSED
from tests.parallel import models


@pytest.fixture(scope="module")
def tiny_llama():
    return build_tiny("hf-tiny-llama")


@pytest.mark.parametrize(
    "tp, heads, kv, repeat, inter, vocab",
    [
        (1, 4, 2, 1, 688, 512),
        (2, 2, 1, 1, 344, 256),
        (4, 1, 1, 2, 172, 128),  # more ranks than KV heads: each KV head on 2 ranks
    ],
)
def test_tiny_llama_layout(tiny_llama, tp, heads, kv, repeat, inter, vocab):
    lay = plan(tiny_llama, tp)
    assert (lay.heads, lay.kv_heads, lay.kv_repeat, lay.intermediate, lay.vocab) == (heads, kv, repeat, inter, vocab)
    # rank r's query heads use exactly the KV head it holds (GQA groups kept)
    groups = tiny_llama.config.num_attention_heads // tiny_llama.config.num_key_value_heads
    for r in range(tp):
        q_heads = range(r * heads, (r + 1) * heads)
        kv_start = lay.kv_rows(r).start // lay.head_dim
        assert {h // groups for h in q_heads} <= set(range(kv_start, kv_start + kv))


@pytest.mark.parametrize(
    "factory, tp, message",
    [
        ("hf-tiny-qwen2", 2, "tp=2 does not divide config.num_attention_heads=5"),
        ("hf-tiny-llama", 8, "tp=8 does not divide config.num_attention_heads=4"),
        ("hf-tiny-llama", 3, "tp=3 does not divide config.num_attention_heads=4"),
        (models.WIDE8, 3, "tp=3 does not divide config.num_attention_heads=8"),
        (
            models.GPT2,
            2,
            "model_type 'gpt2' (GPT2LMHeadModel) is not supported (its q, k and v come from one "
            "fused c_attn Conv1D (and its MLP is c_fc / c_proj)); supported: llama, qwen2, mistral, "
            "qwen3_moe, mixtral, deepseek_v3",
        ),
        ("refmodel", 2, "got 'refmodel' (RefModelLM)"),
    ],
)
def test_refusals_name_the_field_and_value(factory, tp, message):
    with pytest.raises(TensorParallelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan(load_model(factory), tp)


def test_vocab_not_divisible_is_padded_as_vllm_pads_it():
    m = build_tiny("hf-tiny-llama")
    m.config.vocab_size = 510
    lay = plan(m, 4)
    assert (lay.vocab, lay.vocab_size) == (128, 510)  # 510 -> 512 rows, 128 a rank


def test_kv_heads_neither_divisor_nor_multiple():
    m = build_tiny("hf-tiny-llama")
    m.config.num_attention_heads, m.config.num_key_value_heads = 12, 3
    with pytest.raises(
        TensorParallelError, match="tp=4 neither divides nor is a multiple of config.num_key_value_heads=3"
    ):
        plan(m, 4)


def test_missing_module_is_named():
    m = build_tiny("hf-tiny-llama")
    m.model.layers[1].mlp.down_proj = torch.nn.Identity()
    with pytest.raises(TensorParallelError, match=r"model.layers.1.mlp.down_proj is not an nn.Linear"):
        plan(m, 2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tp=0), "tp must be an int >= 1, got 0"),
        (dict(tp=2, batch_invariant=True), VERIFIED_REFUSED[:60]),
        (dict(tp=2, portable=True), "portable=True needs batch_invariant=True"),
    ],
)
def test_spec_refusals(kwargs, message):
    with pytest.raises(TensorParallelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TPModelSpec("hf-tiny-llama", **kwargs)
