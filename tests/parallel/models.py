"""Models for the tensor-parallel tests, as ``module:factory`` specs the rank processes import.

None of these shapes is one the project ships: they are "a model the project never saw"
(``unseen_llama``: hidden 64, intermediate 96, 4 heads, 2 KV heads), a Qwen2 with q/k/v
biases and tied embeddings that TP=2 and TP=4 divide, a Llama with GPT-2's odd vocabulary (50257:
padded to 50304 as vLLM pads it), a Llama with biases on every
projection (the row-parallel bias path; also in bfloat16, where the order of the bias
and the rounding matters), one with 8 heads for the opt-in TP=8 run, and a
GPT-2 and an OLMoE (architectures the runner refuses by name, with why); the MoE models
(Qwen3-MoE, Mixtral: 8 experts, 3 a token) and the MLA model (DeepSeek-V3) of
test_moe.py and test_mla.py.
"""

from __future__ import annotations

from detsample.models.tiny import TINY_VOCAB, build_hf, seeded_init_

_SMALL = dict(vocab_size=TINY_VOCAB, max_position_embeddings=256, rms_norm_eps=1e-5, num_hidden_layers=2)

UNSEEN = "tests.parallel.models:unseen_llama"
QWEN2 = "tests.parallel.models:qwen2_biased"
BIASED = "tests.parallel.models:llama_biased"
WIDE8 = "tests.parallel.models:llama_8_heads"
BIASED_BF16 = "tests.parallel.models:llama_biased_bf16"
GPT2 = "tests.parallel.models:gpt2"
QWEN3_MOE = "tests.parallel.models:qwen3_moe"
MIXTRAL = "tests.parallel.models:mixtral"
MIXTRAL_BATCHED = "tests.parallel.models:mixtral_batched"
DEEPSEEK = "tests.parallel.models:deepseek_v3"
OLMOE = "tests.parallel.models:olmoe"
ODD_VOCAB = "tests.parallel.models:llama_gpt2_vocab"
#: GPT-2's vocabulary: no TP size > 1 divides it
GPT2_VOCAB = 50257


def unseen_llama():
    return build_hf(
        "llama",
        11,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        **_SMALL,
    )


def qwen2_biased():
    return build_hf(
        "qwen2",
        12,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        use_sliding_window=False,
        **_SMALL,
    )


def llama_gpt2_vocab():
    return build_hf(
        "llama",
        15,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        **{**_SMALL, "vocab_size": GPT2_VOCAB, "num_hidden_layers": 1},
    )


def llama_biased():
    return build_hf(
        "llama",
        13,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=4,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=False,
        **_SMALL,
    )


def llama_biased_bf16():
    import torch

    return build_hf(
        "llama",
        13,
        dtype=torch.bfloat16,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=4,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=False,
        **_SMALL,
    )


def llama_8_heads():
    return build_hf(
        "llama",
        14,
        hidden_size=128,
        intermediate_size=128,
        num_attention_heads=8,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        **_SMALL,
    )


def _transformers(config: str, model: str, seed: int, **fields):
    """``transformers.<model>(<config>(**fields))`` with seeded weights (the global RNG kept)."""
    import torch
    import transformers

    cfg = getattr(transformers, config)(
        **{
            **_SMALL,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            **fields,
        }
    )
    with torch.random.fork_rng(devices=[]):
        m = getattr(transformers, model)(cfg)
    return seeded_init_(m, seed).eval()


# MoE: 8 experts, 3 a token (with 2 a token any order of the sum gives the same bits: the
# combine's order would go untested), more experts than ranks at TP=4


def qwen3_moe():
    return _transformers(
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        21,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=32,
        intermediate_size=64,
        norm_topk_prob=True,
    )


def mixtral():
    return _transformers(
        "MixtralConfig",
        "MixtralForCausalLM",
        22,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=3,
        intermediate_size=32,
    )


def mixtral_batched():
    m = mixtral()
    m.config._experts_implementation = "batched_mm"  # the pairs' products, one each
    return m


def deepseek_v3():
    """MLA (q LoRA 32, KV LoRA 16, qk 16 + 8 rope, v 16), a dense first layer, then MoE
    (sigmoid router, grouped top-k, a shared expert)."""
    return _transformers(
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        23,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=32,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=2,
        topk_group=1,
        intermediate_size=64,
        rope_interleave=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
    )


def olmoe():
    """Refused by name: its QK-norm spans all heads."""
    return _transformers(
        "OlmoeConfig",
        "OlmoeForCausalLM",
        24,
        num_key_value_heads=2,
        num_experts=8,
        num_experts_per_tok=3,
        intermediate_size=32,
    )


def gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return GPT2LMHeadModel(
            GPT2Config(
                vocab_size=TINY_VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=0
            )
        ).eval()


QWEN35 = "tests.parallel.models:qwen35_hybrid"
NEMOTRON_H = "tests.parallel.models:nemotron_h"


def _from_config(config: str, model: str, seed: int, **fields):
    import torch
    import transformers

    cfg = getattr(transformers, config)(**fields)
    with torch.random.fork_rng(devices=[]):
        module = getattr(transformers, model)(cfg)
    return seeded_init_(module, seed).eval()


def qwen35_hybrid(key_heads: int = 4):
    """Qwen3.5-style: a gated delta-net layer (4 key heads, 8 value heads of 16) and a gated
    full-attention layer (4 heads, 2 KV heads); TP=2 and TP=4 divide its key heads."""
    return _from_config(
        "Qwen3_5TextConfig",
        "Qwen3_5ForCausalLM",
        21,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_value_heads=8,
        linear_num_key_heads=key_heads,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        layer_types=["linear_attention", "full_attention"],
        tie_word_embeddings=False,
        **_SMALL,
    )


def nemotron_h(groups: int = 4):
    """A Mamba 2 hybrid (Nemotron-H): a Mamba 2 mixer (4 heads of 16 in ``groups`` groups,
    state 16), an attention (4 heads, 2 KV heads) and two ungated MLPs."""
    return _from_config(
        "NemotronHConfig",
        "NemotronHForCausalLM",
        22,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        layers_block_type=["mamba", "mlp", "attention", "mlp"],
        mamba_num_heads=4,
        mamba_head_dim=16,
        ssm_state_size=16,
        n_groups=groups,
        chunk_size=8,
        tie_word_embeddings=False,
        **{**{k: v for k, v in _SMALL.items() if k != "rms_norm_eps"}, "num_hidden_layers": 4},
    )


def nemotron_h_two_groups():
    return nemotron_h(groups=2)


QWEN2_MOE = "tests.parallel.models:qwen2_moe"
QWEN3_NEXT = "tests.parallel.models:qwen3_next"  # refused by name


def qwen2_moe():
    """Qwen2-MoE: 8 experts, 3 a token, a shared expert scaled by a sigmoid gate."""
    return _from_config(
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        23,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        tie_word_embeddings=False,
        **_SMALL,
    )


def qwen3_next():
    """Qwen3-Next: a gated delta-net layer and a gated attention layer, each with an MoE
    (4 experts, 2 a token, a gated shared expert)."""
    return _from_config(
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        24,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        linear_num_value_heads=8,
        linear_num_key_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        full_attention_interval=2,
        tie_word_embeddings=False,
        **_SMALL,
    )
