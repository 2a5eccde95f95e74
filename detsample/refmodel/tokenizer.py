"""Byte-level tokenizer compatible with the default vocabulary layout.

Layout (shared with ``detsample.Vocabulary.default()``): id 0 is EOS (special, decodes to
no bytes); ids 1..256 are the single bytes 0x00..0xFF (``id = byte + 1``); ids 257..511
are the default vocabulary's merged tokens. :func:`encode` uses ids 1..256 only (one id
per byte, so lengths are predictable); ``Vocabulary.default().encode`` is the greedy
merged encoding. :func:`decode` reads every id of the default vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable

from detsample.refmodel.config import RefModelError

EOS_ID = 0
BYTE_OFFSET = 1
N_BYTE_TOKENS = 256


def encode(text: str | bytes) -> list[int]:
    """UTF-8 bytes of ``text`` (or the bytes themselves) as ids ``byte + 1``; no EOS added."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    elif not isinstance(text, (bytes, bytearray)):
        raise RefModelError(f"text must be str or bytes, got {type(text).__name__}")
    return [b + BYTE_OFFSET for b in text]


def token_bytes(token_id: int) -> bytes:
    """Bytes of one id: ``b""`` for EOS, one byte for ids 1..256, the default
    vocabulary's merged token for 257..511; larger ids raise."""
    if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
        raise RefModelError(f"token_id must be a non-negative integer, got {token_id!r}")
    if token_id == EOS_ID:
        return b""
    if token_id <= N_BYTE_TOKENS:
        return bytes([token_id - BYTE_OFFSET])
    from detsample.vocab import DEFAULT_MERGES

    if token_id < N_BYTE_TOKENS + 1 + len(DEFAULT_MERGES):
        return DEFAULT_MERGES[token_id - N_BYTE_TOKENS - 1].encode("utf-8")
    raise RefModelError(
        f"token_id must be < {N_BYTE_TOKENS + 1 + len(DEFAULT_MERGES)} (the default vocabulary), got {token_id}"
    )


def decode(ids: Iterable[int]) -> bytes:
    """Concatenated bytes of ``ids`` (EOS contributes nothing)."""
    return b"".join(token_bytes(t) for t in ids)


def decode_text(ids: Iterable[int]) -> str:
    """:func:`decode` as UTF-8 text, invalid sequences replaced by U+FFFD."""
    return decode(ids).decode("utf-8", errors="replace")
