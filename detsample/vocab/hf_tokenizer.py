"""Read a local Hugging Face ``tokenizer.json`` into token byte strings.

Used by :meth:`detsample.Vocabulary.from_tokenizer_json`. Only the local file is read
(through the ``tokenizers`` package); nothing is downloaded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from detsample.errors import InvalidSamplingParams

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SP_SPACE = "\u2581"


def byte_level_decoder() -> dict[str, int]:
    """GPT-2's unicode -> byte table (the inverse of ``bytes_to_unicode``)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _component_types(node: Any) -> set[str]:
    """Every ``type`` named in a (possibly nested Sequence) tokenizer component."""
    out: set[str] = set()
    if isinstance(node, dict):
        if "type" in node:
            out.add(str(node["type"]))
        for v in node.values():
            out |= _component_types(v)
    elif isinstance(node, list):
        for v in node:
            out |= _component_types(v)
    return out


def _style(spec: dict[str, Any]) -> str:
    types = _component_types(spec.get("decoder")) | _component_types(spec.get("pre_tokenizer"))
    if "ByteLevel" in types:
        return "byte_level"
    if "ByteFallback" in types or "Metaspace" in types or "Replace" in types:
        return "sentencepiece"
    return "raw"


def _token_bytes(text: str, style: str, bl: dict[str, int]) -> bytes:
    if style == "byte_level":
        try:
            return bytes(bl[c] for c in text)
        except KeyError:
            return text.encode("utf-8")  # not a byte-level spelling: take it literally
    if style == "sentencepiece":
        m = _BYTE_FALLBACK.match(text)
        if m:
            return bytes([int(m.group(1), 16)])
        return text.replace(_SP_SPACE, " ").encode("utf-8")
    return text.encode("utf-8")


def read_tokenizer_json(path: Path, vocab_size: int | None) -> tuple[list[bytes], set[int], dict[int, str]]:
    """``(tokens, special_ids, special_names)`` of a local ``tokenizer.json``.

    ``tokens[i]`` is the byte spelling of id i; id gaps and padding up to ``vocab_size``
    are special ``b""`` entries. ``special_names`` maps special ids to their text.
    """
    from tokenizers import Tokenizer

    if not path.is_file():
        raise InvalidSamplingParams(f"tokenizer.json path must be an existing file, got {str(path)!r}")
    tok = Tokenizer.from_file(str(path))
    spec = json.loads(path.read_text(encoding="utf-8"))
    style = _style(spec)
    bl = byte_level_decoder()
    added = tok.get_added_tokens_decoder()
    vocab = tok.get_vocab(with_added_tokens=True)
    n = max(vocab.values(), default=-1) + 1
    if vocab_size is not None:
        if vocab_size < n:
            raise InvalidSamplingParams(f"vocab_size must be >= the tokenizer's {n} ids, got {vocab_size}")
        n = vocab_size
    tokens: list[bytes | None] = [None] * n
    special: set[int] = set()
    names: dict[int, str] = {}
    for text, tid in vocab.items():
        at = added.get(tid)
        if at is not None:
            tokens[tid] = at.content.encode("utf-8")  # added tokens are stored verbatim
            if at.special:
                special.add(tid)
                names[tid] = at.content
        else:
            tokens[tid] = _token_bytes(text, style, bl)
    for i, t in enumerate(tokens):
        if t is None or t == b"":
            tokens[i] = b""
            special.add(i)
    return tokens, special, names  # type: ignore[return-value]
