"""The architecture panel: tiny configs of transformers architectures RL teams train, with
seeded random weights (no hub), and the bitwise checks run on each.

Every config is small (hidden 64, 2 layers, a 512-token vocabulary) but keeps what makes
its architecture different: MoE routing (softmax / sigmoid, top-k, grouped top-k, shared
experts), MLA's unequal head dims, attention sinks, soft-capping, sliding windows, partial
rotary, QK-norm, and linear-attention and state-space hybrids (bitwise: the mode runs their
mixer by its recurrent update, detsample/invariant/mixers.py; a family it did not cover
would be refused by name: such mixers keep state beyond keys and values).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from detsample.invariant import batch_invariant
from detsample.invariant.guard import GUARD
from detsample.models import HFCausalLM, prefill
from detsample.models.tiny import seeded_init_

BASE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

_LINEAR = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16)
_MAMBA = dict(mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16, mamba_n_groups=1, mamba_chunk_size=8)


@dataclass(frozen=True)
class Arch:
    name: str
    config: str
    model: str
    extra: dict[str, Any] = field(default_factory=dict)
    features: str = ""
    moe: bool = False
    refused: str = ""  # a regex the mode's RefusedLayerError must match ("": runs)
    own_cache: bool = False  # checked through transformers' own cache (own_cache_failures)
    covered: bool = False  # a recurrent mixer the mode runs by its recurrent update
    #: why transformers' own chunked prefill is wrong, so not compared with the default
    #: kernels ("": it is); the mode's cover corrects it, and it is compared under the mode
    unchunked: str = ""


PANEL: tuple[Arch, ...] = (
    Arch("llama", "LlamaConfig", "LlamaForCausalLM", features="dense, GQA"),
    Arch("qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16), "QK-norm"),
    Arch("mistral", "MistralConfig", "MistralForCausalLM", features="dense"),
    Arch(
        "gemma2",
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(head_dim=16, attn_logit_softcapping=0.5, final_logit_softcapping=3.0, sliding_window=8),
        "soft-capping, sliding window",
    ),
    Arch(
        "gemma3",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(head_dim=16, sliding_window=8),
        "sliding window, QK-norm",
    ),
    Arch("phi3", "Phi3Config", "Phi3ForCausalLM", features="fused qkv, partial rotary"),
    Arch("olmo2", "Olmo2Config", "Olmo2ForCausalLM", features="QK-norm"),
    Arch("granite", "GraniteConfig", "GraniteForCausalLM", features="scaled residuals"),
    Arch("starcoder2", "Starcoder2Config", "Starcoder2ForCausalLM", features="biases, LayerNorm"),
    Arch(
        "gpt2",
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(n_embd=64, n_layer=2, n_head=4, n_positions=1024),
        "learned positions, gelu_new",
    ),
    Arch("gptneox", "GPTNeoXConfig", "GPTNeoXForCausalLM", features="parallel residual, partial rotary"),
    Arch("stablelm", "StableLmConfig", "StableLmForCausalLM", features="partial rotary"),
    Arch("phi", "PhiConfig", "PhiForCausalLM", features="partial rotary, gelu"),
    Arch("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM", features="NoPE layers"),
    Arch("cohere2", "Cohere2Config", "Cohere2ForCausalLM", dict(sliding_window=8), "sliding window, LayerNorm"),
    Arch(
        "apertus",
        "ApertusConfig",
        "ApertusForCausalLM",
        dict(head_dim=16),
        "xIELU activation (expm1, softplus), QK-norm",
    ),
    Arch(
        "qwen3moe",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
        "MoE (softmax top-k)",
        moe=True,
    ),
    Arch(
        "qwen2moe",
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48),
        "MoE + shared expert",
        moe=True,
    ),
    Arch(
        "mixtral",
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_local_experts=4, num_experts_per_tok=2),
        "MoE",
        moe=True,
    ),
    Arch(
        "olmoe", "OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=4, num_experts_per_tok=2), "MoE, QK-norm", moe=True
    ),
    Arch(
        "deepseekv3",
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_shared_experts=1,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
            num_key_value_heads=4,
        ),
        "MLA (qk 24, v 16), MoE (sigmoid, grouped top-k)",
        moe=True,
    ),
    Arch(
        "gptoss",
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
        "attention sinks, MoE, sliding window",
        moe=True,
    ),
    Arch(
        "glm4moe",
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        dict(
            head_dim=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_shared_experts=1,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
        ),
        "MoE (sigmoid, grouped top-k, shared expert), partial rotary",
        moe=True,
    ),
    Arch("olmo3", "Olmo3Config", "Olmo3ForCausalLM", dict(sliding_window=8), "sliding window, QK-norm"),
    Arch(
        "ernie45moe",
        "Ernie4_5_MoeConfig",
        "Ernie4_5_MoeForCausalLM",
        dict(head_dim=16, moe_num_experts=4, moe_k=2, moe_intermediate_size=32, moe_layer_start_index=1),
        "MoE (softmax, correction bias)",
        moe=True,
    ),
    Arch(
        "hunyuanmoe",
        "HunYuanMoEV1Config",
        "HunYuanMoEV1ForCausalLM",
        dict(head_dim=16, num_experts=4, moe_topk=2),
        "MoE, QK-norm",
        moe=True,
    ),
    Arch("seedoss", "SeedOssConfig", "SeedOssForCausalLM", dict(head_dim=16), "dense, biases"),
    Arch(
        "exaone4",
        "Exaone4Config",
        "Exaone4ForCausalLM",
        dict(head_dim=16, sliding_window=8),
        "sliding window, QK-norm, post-norm",
    ),
    Arch(
        "dots1",
        "Dots1Config",
        "Dots1ForCausalLM",
        dict(
            head_dim=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_shared_experts=1,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
        ),
        "MoE (sigmoid, grouped top-k)",
        moe=True,
    ),
    Arch(
        "minimaxm2",
        "MiniMaxM2Config",
        "MiniMaxM2ForCausalLM",
        dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2),
        "MoE (sigmoid)",
        moe=True,
    ),
    Arch(
        "qwen3next",
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        dict(
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            full_attention_interval=2,
        ),
        "gated delta-net linear attention + MoE hybrid",
        moe=True,
        own_cache=True,
        covered=True,
    ),
    Arch(
        "qwen35",
        "Qwen3_5TextConfig",
        "Qwen3_5ForCausalLM",
        dict(head_dim=16, **_LINEAR, layer_types=["linear_attention", "full_attention"]),
        "gated delta-net linear attention hybrid",
        own_cache=True,
        covered=True,
    ),
    Arch(
        "qwen35moe",
        "Qwen3_5MoeTextConfig",
        "Qwen3_5MoeForCausalLM",
        dict(
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            **_LINEAR,
            layer_types=["linear_attention", "full_attention"],
        ),
        "gated delta-net + MoE hybrid",
        moe=True,
        own_cache=True,
        covered=True,
    ),
    Arch(
        "kimilinear",
        "KimiLinearConfig",
        "KimiLinearForCausalLM",
        dict(
            layer_types=["linear_attention", "full_attention"],
            linear_head_dim=16,
            linear_num_heads=4,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            num_key_value_heads=4,
        ),
        "Kimi delta attention + MLA + MoE hybrid",
        moe=True,
        own_cache=True,
        covered=True,
    ),
    Arch(
        "nemotronh",
        "NemotronHConfig",
        "NemotronHForCausalLM",
        dict(
            layers_block_type=["mamba", "attention"],
            head_dim=16,
            mamba_num_heads=4,
            mamba_head_dim=16,
            ssm_state_size=16,
            n_groups=1,
            chunk_size=8,
        ),
        "Mamba 2 hybrid (dt limit from time_step_min)",
        own_cache=True,
        covered=True,
    ),
    Arch(
        "granitehybrid",
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        dict(
            layer_types=["mamba", "attention"],
            num_local_experts=4,
            num_experts_per_tok=2,
            shared_intermediate_size=32,
            **_MAMBA,
        ),
        "Mamba 2 + MoE hybrid (Granite 4)",
        moe=True,
        own_cache=True,
        covered=True,
    ),
    Arch(
        "bamba",
        "BambaConfig",
        "BambaForCausalLM",
        dict(attn_layer_indices=[1], **_MAMBA),
        "Mamba 2 hybrid",
        own_cache=True,
        covered=True,
    ),
    Arch(
        "falconh1",
        "FalconH1Config",
        "FalconH1ForCausalLM",
        dict(head_dim=16, mamba_d_ssm=128, **_MAMBA),
        "Mamba 2 heads in parallel with attention heads",
        own_cache=True,
        covered=True,
    ),
    Arch(
        "mamba2",
        "Mamba2Config",
        "Mamba2ForCausalLM",
        dict(num_heads=4, head_dim=32, state_size=16, n_groups=1, chunk_size=8, expand=2),
        "Mamba 2, no attention",
        own_cache=True,
        covered=True,
    ),
    Arch(
        "jamba",
        "JambaConfig",
        "JambaForCausalLM",
        dict(
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            num_experts=4,
            num_experts_per_tok=2,
            mamba_d_state=16,
            mamba_dt_rank=8,
        ),
        "Mamba + MoE hybrid (B, C, dt norms)",
        moe=True,
        own_cache=True,
        covered=True,
    ),
    Arch(
        "mamba",
        "MambaConfig",
        "MambaForCausalLM",
        dict(state_size=16, time_step_rank=8, expand=2),
        "Mamba, no attention",
        own_cache=True,
        covered=True,
    ),
    Arch(
        "falconmamba",
        "FalconMambaConfig",
        "FalconMambaForCausalLM",
        dict(state_size=16, time_step_rank=8, expand=2),
        "Mamba with B, C, dt norms, no attention",
        own_cache=True,
        covered=True,
    ),
    Arch(
        "zamba2",
        "Zamba2Config",
        "Zamba2ForCausalLM",
        dict(
            layers_block_type=["mamba", "hybrid"],
            mamba_headdim=32,
            n_mamba_heads=4,
            mamba_d_state=16,
            mamba_ngroups=1,
            chunk_size=8,
            attention_head_dim=16,
            num_mem_blocks=1,
            use_shared_attention_adapter=False,
            adapter_rank=8,
        ),
        "Mamba 2 layers + a shared attention block (Zamba2)",
        own_cache=True,
        covered=True,
    ),
    Arch(
        "zamba",
        "ZambaConfig",
        "ZambaForCausalLM",
        dict(
            layers_block_type=["mamba", "hybrid", "hybrid"],
            num_hidden_layers=3,
            n_mamba_heads=2,
            mamba_d_state=16,
            mamba_dt_rank=8,
            attention_head_dim=16,
        ),
        "Mamba heads split per head + a shared attention block (Zamba)",
        refused=r"ZambaMambaMixer|recurrent_states",
    ),
    Arch(
        "lfm2",
        "Lfm2Config",
        "Lfm2ForCausalLM",
        dict(layer_types=["conv", "full_attention"], block_ff_dim=96, block_auto_adjust_ff_dim=False),
        "short convolutions beside attention",
        own_cache=True,
    ),
    Arch(
        "minimax",
        "MiniMaxConfig",
        "MiniMaxForCausalLM",
        dict(
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            block_size=8,
            layer_types=["linear_attention", "full_attention"],
        ),
        "lightning attention (linear, blocks of 8) + MoE hybrid",
        moe=True,
        own_cache=True,
        covered=True,
        unchunked="MiniMaxCache.get_seq_length() reads the linear layer's empty key store (0), "
        "so a chunk's attention mask leaves out the cached keys",
    ),
)
BY_NAME = {a.name: a for a in PANEL}


def build(arch: Arch, seed: int = 3, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """``arch`` with seeded weights (the caller's global RNG untouched)."""
    import transformers

    cfg = getattr(transformers, arch.config)(**{**BASE, **arch.extra})
    with torch.random.fork_rng(devices=[]):
        model = getattr(transformers, arch.model)(cfg)
    return seeded_init_(model, seed).to(dtype).eval()


def failures(lm: Any, tokens: list[int]) -> tuple[list[str], torch.Tensor]:
    """What breaks, bitwise, for ``lm``: decode vs prefill, chunked prefill, a row among
    shorter and longer neighbours with left and right padding; and the prefill logits."""
    bad = []
    full = prefill(lm, tokens)
    cache = lm.new_cache()
    steps = [prefill(lm, tokens[:1], cache)] + [lm.forward([cache], [[t]])[0] for t in tokens[1:]]
    if not torch.equal(torch.cat(steps), full):
        bad.append("decode != prefill")
    cache, parts, i = lm.new_cache(), [], 0
    for n in (3, 7, 100):
        parts.append(lm.forward([cache], [tokens[i : i + n]])[0])
        i += n
        if i >= len(tokens):
            break
    if not torch.equal(torch.cat(parts), full):
        bad.append("chunked prefill != prefill")
    for side in ("left", "right"):
        padded = lm.with_padding(side)
        rows = padded.forward([padded.new_cache() for _ in range(3)], [tokens[:4], tokens, tokens + tokens[:5]])
        if not torch.equal(rows[1], full):
            bad.append(f"{side}-padded batch != alone")
    return bad, full


def adapter(model: torch.nn.Module, mode: bool, portable: bool = False) -> HFCausalLM:
    return HFCausalLM(model, batch_invariant=mode, portable=portable)


@contextmanager
def unguarded() -> Iterator[None]:
    """Inside the mode: its kernels without the guard's hooks (negative controls only)."""
    GUARD.uninstall()
    try:
        yield
    finally:
        GUARD.install()


def _padded_row(model: torch.nn.Module, tokens: list[int], side: str) -> torch.Tensor:
    """``tokens``' logits as the middle row of a padded batch among a shorter and a longer
    row (positions from the mask, as an engine gives them)."""
    rows = [tokens[:4], tokens, tokens + tokens[:5]]
    width = max(map(len, rows))
    ids = torch.zeros((3, width), dtype=torch.int64)
    mask = torch.zeros((3, width), dtype=torch.int64)
    for i, r in enumerate(rows):
        at = slice(width - len(r), width) if side == "left" else slice(0, len(r))
        ids[i, at], mask[i, at] = torch.tensor(r), 1
    logits = model(ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits[1]
    return logits[width - len(tokens) :] if side == "left" else logits[: len(tokens)]


def own_cache_failures(
    model: torch.nn.Module, tokens: list[int], portable: bool | None, guarded: bool = True, chunked: bool = True
) -> tuple[list[str], torch.Tensor]:
    """:func:`failures` through transformers' own cache (a hybrid's holds its convolution
    windows, which the adapter's key/value cache cannot): decode, chunked prefill (3, 7,
    rest; each call given its positions: Bamba counts from 0 at every call otherwise), left- and right-padded batch; ``portable`` None runs the default kernels;
    ``guarded`` False runs the mode's kernels without the guard (negative controls);
    ``chunked`` False leaves the chunked prefill out."""
    ids, bad = torch.tensor([tokens]), []
    mode = nullcontext() if portable is None else batch_invariant(portable=portable)
    with torch.no_grad(), mode, nullcontext() if guarded or portable is None else unguarded():
        full = model(ids).logits[0]
        splits = (("decode", range(1, len(tokens))), ("chunked prefill", (3, 10)))
        for name, cuts in splits if chunked else splits[:1]:
            bounds = [0, *cuts, len(tokens)]
            out = model(ids[:, : bounds[1]], use_cache=True)
            key = "cache" if "cache" in out.keys() else "past_key_values"  # noqa: SIM118 - a ModelOutput; Mamba: "cache"
            parts, cache = [out.logits[0]], {key: out[key]}
            for a, b in zip(bounds[1:], bounds[2:]):  # positions given, as an engine gives them
                parts.append(
                    model(ids[:, a:b], **cache, use_cache=True, position_ids=torch.arange(a, b)[None]).logits[0]
                )
            if not torch.equal(torch.cat(parts), full):
                bad.append(f"{name} != prefill")
        for side in ("left", "right"):
            if not torch.equal(_padded_row(model, tokens, side), full):
                bad.append(f"{side}-padded batch != alone")
    return bad, full
