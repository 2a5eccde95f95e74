"""Byte tokenizer: id 0 = EOS (no bytes), id = byte + 1 for bytes, merged ids not guessed.

Bug pinned: an off-by-one byte mapping that would disagree with Vocabulary.default().
"""

from __future__ import annotations

import pytest

from detsample.refmodel import RefModelError
from detsample.refmodel import tokenizer as tok
from detsample.vocab import Vocabulary

ROUNDTRIP = ["", "hello", "héllo ✓", "\x00\xff"]


@pytest.mark.parametrize("text", ROUNDTRIP)
def test_roundtrip(text):
    ids = tok.encode(text)
    assert all(1 <= i <= 256 for i in ids)
    assert tok.decode_text(ids) == text
    assert tok.decode(ids + [tok.EOS_ID]) == text.encode("utf-8")


def test_layout():
    assert tok.encode(b"\x00\x41\xff") == [1, 66, 256]
    assert tok.token_bytes(0) == b""
    assert [tok.token_bytes(i) for i in (1, 256)] == [b"\x00", b"\xff"]


def test_agrees_with_default_vocabulary():
    """Every id 0..511 spells the same bytes here and in Vocabulary.default()."""
    vocab = Vocabulary.default()
    assert [tok.token_bytes(i) for i in range(512)] == [vocab.decode([i]) for i in range(512)]
    text = "héllo, the world"
    assert vocab.decode(tok.encode(text)) == text.encode("utf-8")
    assert tok.decode(vocab.encode(text)) == text.encode("utf-8")


@pytest.mark.parametrize("bad,msg", [(512, "got 512"), (-1, "non-negative"), (True, "non-negative integer")])
def test_bad_ids(bad, msg):
    with pytest.raises(RefModelError, match=msg):
        tok.token_bytes(bad)


def test_bad_text():
    with pytest.raises(RefModelError, match="text must be str or bytes, got int"):
        tok.encode(5)  # type: ignore[arg-type]
