"""Tiny Hugging Face models built offline: a config and seeded random weights, no hub.

``build_tiny("hf-tiny-llama")`` and ``build_tiny("hf-tiny-qwen2")`` are real
``transformers`` models (``LlamaForCausalLM``, ``Qwen2ForCausalLM``) in float32, the code
users run, small enough for a test: the Llama has 4 layers of width 256 with grouped-query
attention (4 query heads, 2 KV heads); the Qwen2 has 3 layers of width 160 with 5 heads of
32 and one KV head, q/k/v biases and tied embeddings. Both use the 512-token vocabulary of
:meth:`detsample.Vocabulary.default` (bytes + merges), so the reference tokenizer, the
engine and grammars work with them.

Weights are seeded normal values by detsample's definition (:mod:`detsample.models.seeded`:
Philox counters, a Box-Muller of detsample's ``log`` / ``cos`` / ``sin``), parameter by
parameter in ``named_parameters()`` order, scaled per kind (std 0.15 for embeddings and
the head, 0.05 for projections and biases, norm gains 1 + 0.1 z): the same bits on every
machine, ISA and torch build and in every process (``torch.randn`` with a generator is
not: its vectorised Box-Muller follows ATen's instruction set), and the caller's global
RNG is left as it was (transformers' own initialisation runs under ``fork_rng``).
"""

from __future__ import annotations

from typing import Any

import torch

from detsample.models.base import ModelError
from detsample.models.seeded import normals

TINY_VOCAB = 512

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "hf-tiny-llama": dict(
        vocab_size=TINY_VOCAB,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    "hf-tiny-qwen2": dict(
        vocab_size=TINY_VOCAB,
        hidden_size=160,
        intermediate_size=432,
        num_hidden_layers=3,
        num_attention_heads=5,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
    ),
}

# init scales: normal(0, std) per parameter kind; norm gains 1 + normal(0, 0.1)
_STD = {"embed": 0.15, "lm_head": 0.15, "bias": 0.05, "proj": 0.05}


def _classes(family: str) -> tuple[type, type]:
    if family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaConfig, LlamaForCausalLM
    if family == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        return Qwen2Config, Qwen2ForCausalLM
    raise ModelError(f"family must be 'llama' or 'qwen2', got {family!r}")


def seeded_init_(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Overwrite every parameter of ``model`` with seeded normal values
    (:func:`detsample.models.seeded.normals`: parameter ``i`` of ``named_parameters()``
    takes stream ``i``), computed in float64 and rounded once to the parameter's dtype."""
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            z = normals(int(seed), i, p.numel()).view(p.shape)
            if "norm" in name:
                vals = 1.0 + 0.1 * z
            else:
                kind = (
                    "embed"
                    if "embed" in name
                    else "lm_head"
                    if "lm_head" in name
                    else "bias"
                    if name.endswith("bias")
                    else "proj"
                )
                vals = _STD[kind] * z
            p.copy_(vals.to(torch.float32).to(p.dtype))
    return model


def build_hf(
    family: str,
    seed: int = 0,
    *,
    attn_implementation: str | None = None,
    dtype: torch.dtype = torch.float32,
    **config: Any,
) -> torch.nn.Module:
    """A ``family`` ("llama" | "qwen2") causal LM from ``config`` with seeded weights.

    ``config``: the transformers config fields; every field left out takes the library's
    default, which is a full-size model (LlamaConfig: 32 layers of 4096). For a small
    model start from :data:`TINY_CONFIGS` (or :func:`build_tiny`)."""
    config_cls, model_cls = _classes(family)
    cfg = config_cls(**config)
    if attn_implementation is not None:
        cfg._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):  # transformers' own init draws from the global RNG
        model = model_cls(cfg)
    seeded_init_(model, seed)
    return model.to(dtype).eval()


def build_tiny(
    name: str, seed: int = 0, *, attn_implementation: str | None = None, dtype: torch.dtype = torch.float32
) -> torch.nn.Module:
    """The tiny model ``name`` ("hf-tiny-llama" | "hf-tiny-qwen2")."""
    if name not in TINY_CONFIGS:
        raise ModelError(f"unknown tiny model {name!r}; known: {', '.join(TINY_CONFIGS)}")
    family = name.removeprefix("hf-tiny-")
    return build_hf(family, seed, attn_implementation=attn_implementation, dtype=dtype, **TINY_CONFIGS[name])
