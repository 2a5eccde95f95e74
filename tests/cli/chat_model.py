"""A tiny chat model directory, built locally (no hub): a seeded 2-layer Llama with
``eos_token_id=2`` (``<|im_end|>``) and a generation config naming ids 2 and 5, saved with
``save_pretrained`` (safetensors), beside a WordLevel ``tokenizer.json`` built with the
``tokenizers`` library and a chat template, saved by transformers' fast tokenizer."""

from __future__ import annotations

from pathlib import Path

WORDS = [
    "<unk>",
    "<|im_start|>",
    "<|im_end|>",
    "user",
    "assistant",
    "<|endoftext|>",
    "hello",
    "world",
    "the",
    "cat",
    "a",
    "dog",
    "is",
    "good",
    "yes",
    "no",
]
IM_END = 2
#: the generation config's extra end token (``<|endoftext|>``)
GEN_EOS = 5
TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} "
    "<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> assistant "
    "{% endif %}"
)
CONFIG = dict(
    vocab_size=len(WORDS),
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=IM_END,
    pad_token_id=0,
    tie_word_embeddings=False,
)


def save_chat_model(directory: str | Path, *, template: bool = True, seed: int = 3) -> Path:
    """Write the model, its generation config and its tokenizer to ``directory``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    from detsample.models.tiny import build_hf

    d = Path(directory)
    model = build_hf("llama", seed, **CONFIG)
    model.generation_config = GenerationConfig(eos_token_id=[IM_END, GEN_EOS], bos_token_id=1, pad_token_id=0)
    model.save_pretrained(d)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>", unk_token="<unk>"
    )
    if template:
        fast.chat_template = TEMPLATE
    fast.save_pretrained(d)
    return d
