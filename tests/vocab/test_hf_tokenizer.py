"""Tests of detsample/hf_tokenizer.py via Vocabulary.from_tokenizer_json (local files only)."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from detsample import InvalidSamplingParams, Vocabulary

CORPUS = ["hello world, the cat sat on the mat", "naïve café déjà vu — 東京", '{"a": 1}'] * 10
TEXTS = ["the cat sat", "café 東京 hello", '{"a": 1, "b": [2]}']


def _byte_level(path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(path))
    return tok


def _sentencepiece(path):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for s in ["\u2581", "t", "h", "e", "c", "a", "\u2581t", "\u2581th", "\u2581the", "s"]:
        vocab[s] = len(vocab)
    merges = [("\u2581", "t"), ("\u2581t", "h"), ("\u2581th", "e")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.save(str(path))
    return tok


@pytest.mark.parametrize("text", TEXTS)
def test_byte_level_bytes_match_tokenizer(tmp_path, text):
    """Bug pinned: byte-level tokens read as their unicode spelling ("Ġthe") instead of
    their bytes (" the") give grammar masks for the wrong text."""
    tok = _byte_level(tmp_path / "tokenizer.json")
    v = Vocabulary.from_tokenizer_json(tmp_path / "tokenizer.json")
    ids = tok.encode(text).ids
    assert v.decode(ids) == text.encode("utf-8")
    eos = tok.token_to_id("<|endoftext|>")
    assert v.eos_token_ids == (eos,)
    assert {eos, tok.token_to_id("<|pad|>")} <= v.special_ids
    assert v.vocab_size == tok.get_vocab_size()


@pytest.mark.parametrize("text", ["the cat", "the 東京"])
def test_sentencepiece_byte_fallback(tmp_path, text):
    tok = _sentencepiece(tmp_path / "tokenizer.json")
    v = Vocabulary.from_tokenizer_json(tmp_path / "tokenizer.json")
    ids = tok.encode(text).ids
    assert v.decode(ids) == (" " + text).encode("utf-8")
    assert v.tokens[3 + 0xE6] == b"\xe6"
    assert v.eos_token_ids == (2,) and {0, 1, 2} <= v.special_ids


def test_vocab_size_padding_and_explicit_eos(tmp_path):
    tok = _byte_level(tmp_path / "tokenizer.json")
    n = tok.get_vocab_size()
    v = Vocabulary.from_tokenizer_json(tmp_path / "tokenizer.json", vocab_size=n + 7, eos_token_ids=[1])
    assert v.vocab_size == n + 7 and v.eos_token_ids == (1,)
    assert all(v.tokens[i] == b"" and i in v.special_ids for i in range(n, n + 7))
    with pytest.raises(InvalidSamplingParams, match=f"vocab_size must be >= the tokenizer's {n} ids"):
        Vocabulary.from_tokenizer_json(tmp_path / "tokenizer.json", vocab_size=n - 1)


def test_missing_file_and_missing_eos(tmp_path):
    with pytest.raises(InvalidSamplingParams, match="must be an existing file"):
        Vocabulary.from_tokenizer_json(tmp_path / "nope.json")
    tok = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    tok.save(str(tmp_path / "t.json"))
    with pytest.raises(InvalidSamplingParams, match="no EOS token found"):
        Vocabulary.from_tokenizer_json(tmp_path / "t.json")
