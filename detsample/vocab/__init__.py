"""Token vocabularies: token id -> byte string, with EOS and special tokens.

A :class:`Vocabulary` is what grammar masks need: the byte spelling of every token id.
It is immutable after construction; its :attr:`~Vocabulary.fingerprint` (sha256 over the
token bytes, the special ids and the EOS ids) keys the grammar compile cache.

Three ways to build one:

* :meth:`Vocabulary.default` -- the built-in 512-token vocabulary shared with the
  reference model: id 0 = EOS (special, ``b""``); ids 1..256 = the single bytes
  0x00..0xFF (``id = byte + 1``); ids 257..511 = 255 fixed merged multi-byte tokens.
* :meth:`Vocabulary.from_tokens` -- any list of byte strings.
* :meth:`Vocabulary.from_tokenizer_json` -- a local Hugging Face ``tokenizer.json``
  (read with the ``tokenizers`` package; never a hub download).

Special tokens decode to ``b""``, are never produced by :meth:`~Vocabulary.encode` and
are handed to xgrammar as empty strings, so a grammar can never allow one inside its text
(EOS ids are allowed only where the grammar may stop).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from detsample.params.validation import fail

#: The 255 merged tokens of the default vocabulary (ids 257..511, in this order).
#: Fixed forever: the reference model's embedding rows are laid out by these ids.
DEFAULT_MERGES: tuple[str, ...] = (
    '{"',
    '":',
    '", "',
    '": "',
    '":"',
    '","',
    '"}',
    '"]',
    '["',
    "[{",
    "}]",
    "},",
    "{}",
    "[]",
    "}, {",
    '": {',
    '": [',
    '": ',
    '", ',
    ', "',
    ", ",
    "},{",
    "],",
    '"},',
    '": true',
    '": false',
    '": null',
    "true",
    "false",
    "null",
    '\\"',
    "\\n",
    "\\u",
    "  ",
    "    ",
    "\n ",
    "\n  ",
    "\n    ",
    "\n\n",
    "0.",
    ".0",
    "00",
    "10",
    "12",
    "100",
    "000",
    "-1",
    "1.",
    "20",
    '": 0',
    '": 1',
    "id",
    "name",
    "type",
    "value",
    "key",
    "text",
    "data",
    "items",
    "string",
    "number",
    "object",
    "array",
    "boolean",
    "properties",
    "required",
    '"id',
    '"name',
    '"type',
    '"value',
    "th",
    "he",
    "in",
    "er",
    "an",
    "re",
    "on",
    "at",
    "en",
    "nd",
    "ti",
    "es",
    "or",
    "te",
    "ed",
    "is",
    "al",
    "ar",
    "st",
    "nt",
    "ng",
    "se",
    "ha",
    "ou",
    "le",
    "ve",
    "co",
    "me",
    "de",
    "hi",
    "ri",
    "ro",
    "ic",
    "ne",
    "ea",
    "ra",
    "ce",
    "li",
    "ch",
    "ll",
    "ma",
    "si",
    "om",
    "ur",
    "ing",
    "ion",
    "ent",
    "tion",
    "ation",
    "ter",
    "ver",
    "ers",
    "ly",
    "The",
    ". ",
    ".\n",
    " the",
    " of",
    " and",
    " to",
    " in",
    " is",
    " that",
    " for",
    " it",
    " as",
    " was",
    " with",
    " be",
    " by",
    " on",
    " not",
    " he",
    " this",
    " are",
    " or",
    " his",
    " from",
    " at",
    " which",
    " but",
    " have",
    " an",
    " had",
    " they",
    " you",
    " were",
    " their",
    " one",
    " all",
    " we",
    " can",
    " her",
    " has",
    " there",
    " been",
    " if",
    " more",
    " when",
    " will",
    " would",
    " who",
    " so",
    " no",
    " time",
    " out",
    " up",
    " about",
    " into",
    " than",
    " them",
    " only",
    " other",
    " new",
    " some",
    " what",
    " could",
    " these",
    " two",
    " may",
    " first",
    " then",
    " do",
    " any",
    " like",
    " my",
    " now",
    " over",
    " such",
    " our",
    " man",
    " me",
    " even",
    " most",
    " made",
    " after",
    " also",
    " did",
    " many",
    " before",
    " must",
    " through",
    " back",
    " years",
    " where",
    " much",
    " your",
    " way",
    " well",
    " down",
    " should",
    " because",
    " each",
    " just",
    " those",
    " people",
    " how",
    " too",
    " little",
    " state",
    " good",
    " very",
    " make",
    " world",
    " still",
    " own",
    " see",
    " men",
    " work",
    " long",
    " get",
    " here",
    " between",
    " both",
    " life",
    " being",
    " under",
    " never",
    " day",
    " same",
    " another",
    " know",
    " while",
    " last",
    " might",
)

DEFAULT_VOCAB_SIZE = 512
DEFAULT_EOS_ID = 0
BYTE_OFFSET = 1  # id of byte b = b + BYTE_OFFSET in the default vocabulary

# Spellings recognised as EOS in a tokenizer.json when eos_token_ids is not given.
_EOS_NAMES = ("</s>", "<|endoftext|>", "<eos>", "<|eot_id|>", "<|end_of_text|>", "<|im_end|>", "<|end|>")


def _as_bytes(i: int, tok: Any) -> bytes:
    if isinstance(tok, bytes):
        return tok
    if isinstance(tok, str):
        return tok.encode("utf-8")
    fail(f"tokens[{i}] must be bytes or str, got {type(tok).__name__}")


def _id_set(name: str, ids: Iterable[Any], n: int) -> tuple[int, ...]:
    out = []
    for v in ids:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
            fail(f"{name} must hold token ids in [0, {n}), got {v!r}")
        out.append(int(v))
    return tuple(sorted(set(out)))


class Vocabulary:
    """An immutable token vocabulary (id -> bytes) with EOS and special ids.

    Attributes:
        tokens: ``tuple[bytes, ...]``, one entry per token id.
        eos_token_ids: sorted ``tuple[int, ...]``; always special.
        special_ids: ``frozenset[int]``; EOS ids included.
        vocab_size: ``len(tokens)``.
        fingerprint: hex sha256 of the token bytes, special ids and EOS ids.
    """

    __slots__ = (
        "_tokens",
        "_eos",
        "_special",
        "_fingerprint",
        "_index",
        "_max_len",
        "_lock",
        "_compiler",
        "_tokenizer_info",
    )

    def __init__(self, tokens: Sequence[bytes], eos_token_ids: Sequence[int], special_ids: Iterable[int] = ()) -> None:
        toks = tuple(_as_bytes(i, t) for i, t in enumerate(tokens))
        n = len(toks)
        if n == 0:
            fail("tokens must not be empty, got 0 tokens")
        eos = _id_set("eos_token_ids", eos_token_ids, n)
        if not eos:
            fail("eos_token_ids must name at least one token, got ()")
        special = frozenset(_id_set("special_ids", special_ids, n)) | frozenset(eos)
        for i, t in enumerate(toks):
            if not t and i not in special:
                fail(f"tokens[{i}] is empty but not special; empty tokens must be special")
        self._tokens = toks
        self._eos = eos
        self._special = special
        h = hashlib.sha256()
        h.update(b"detsample-vocab-v1\0%d\0" % n)
        for t in toks:
            h.update(len(t).to_bytes(4, "little"))
            h.update(t)
        h.update(json.dumps([sorted(special), list(eos)]).encode())
        self._fingerprint = h.hexdigest()
        index: dict[bytes, int] = {}
        for i, t in enumerate(toks):
            if i not in special and t not in index:
                index[t] = i  # lowest id wins for duplicate spellings
        self._index = index
        self._max_len = max((len(t) for t in index), default=0)
        self._lock = threading.RLock()
        self._compiler = None
        self._tokenizer_info = None

    # -- constructors ----------------------------------------------------------------
    @classmethod
    def from_tokens(
        cls, tokens: Sequence[bytes | str], *, eos_token_ids: Sequence[int], special_ids: Iterable[int] = ()
    ) -> Vocabulary:
        """A vocabulary from token spellings (``str`` is UTF-8 encoded)."""
        return cls(tokens, eos_token_ids, special_ids)

    @classmethod
    def default(cls) -> Vocabulary:
        """The built-in 512-token vocabulary (layout in the module docstring)."""
        merges = tuple(m.encode("utf-8") for m in DEFAULT_MERGES)
        tokens = (b"",) + tuple(bytes([b]) for b in range(256)) + merges
        if len(tokens) != DEFAULT_VOCAB_SIZE or len(set(merges)) != len(merges):
            raise AssertionError("DEFAULT_MERGES must hold 255 distinct tokens")
        return cls(tokens, (DEFAULT_EOS_ID,), (DEFAULT_EOS_ID,))

    @classmethod
    def from_tokenizer_json(
        cls, path: str | Path, *, eos_token_ids: Sequence[int] | None = None, vocab_size: int | None = None
    ) -> Vocabulary:
        """A vocabulary from a local Hugging Face ``tokenizer.json``.

        Byte-level BPE (GPT-2 style), SentencePiece-style (``\u2581`` spaces and
        ``<0xNN>`` byte fallback) and plain vocabularies are decoded to bytes. Added
        tokens flagged special become special ids; id gaps and ``vocab_size`` padding
        (a model's embedding may be larger than its tokenizer) become special ``b""``.
        EOS ids default to the special tokens spelled like an EOS (``</s>``,
        ``<|endoftext|>``, ...); pass ``eos_token_ids`` when there is none.
        """
        from detsample.vocab.hf_tokenizer import read_tokenizer_json

        tokens, special, names = read_tokenizer_json(Path(path), vocab_size)
        if eos_token_ids is None:
            eos_token_ids = [i for i in sorted(special) if names.get(i) in _EOS_NAMES]
            if not eos_token_ids:
                fail(f"no EOS token found in {path}; pass eos_token_ids explicitly")
        return cls(tokens, eos_token_ids, special)

    # -- properties ------------------------------------------------------------------
    @property
    def tokens(self) -> tuple[bytes, ...]:
        return self._tokens

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def __len__(self) -> int:
        return len(self._tokens)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and other._fingerprint == self._fingerprint

    def __hash__(self) -> int:
        return hash(self._fingerprint)

    def __repr__(self) -> str:
        return (
            f"Vocabulary(vocab_size={self.vocab_size}, eos_token_ids={self._eos}, fingerprint={self._fingerprint[:12]})"
        )

    # -- encode / decode -------------------------------------------------------------
    def encode(self, text: str | bytes) -> list[int]:
        """Greedy longest-match tokenisation over the non-special tokens.

        Deterministic. Raises :class:`InvalidSamplingParams` naming the byte offset when
        the greedy walk meets bytes no token spells (never for the default vocabulary,
        which holds every single byte).
        """
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        out: list[int] = []
        i, n, index = 0, len(data), self._index
        while i < n:
            for ln in range(min(self._max_len, n - i), 0, -1):
                tid = index.get(data[i : i + ln])
                if tid is not None:
                    out.append(tid)
                    i += ln
                    break
            else:
                fail(f"cannot encode byte {data[i : i + 1]!r} at offset {i}: no token spells it")
        return out

    def decode(self, ids: Iterable[int]) -> bytes:
        """Concatenated token bytes; special tokens decode to ``b""``."""
        parts = []
        n = len(self._tokens)
        for v in ids:
            tid = int(v)
            if not 0 <= tid < n:
                fail(f"token id must be in [0, {n}), got {v!r}")
            if tid not in self._special:
                parts.append(self._tokens[tid])
        return b"".join(parts)

    # -- grammar support (lazy, per instance: no global state) ------------------------
    def xgrammar_tokenizer_info(self):
        """The ``xgrammar.TokenizerInfo`` (RAW vocab, specials as ``b""``), built once."""
        with self._lock:
            if self._tokenizer_info is None:
                import xgrammar as xgr

                enc = [b"" if i in self._special else t for i, t in enumerate(self._tokens)]
                self._tokenizer_info = xgr.TokenizerInfo(
                    enc, xgr.VocabType.RAW, vocab_size=len(enc), stop_token_ids=list(self._eos), add_prefix_space=False
                )
            return self._tokenizer_info

    @property
    def grammar_compiler(self):
        """This vocabulary's :class:`detsample.grammar.GrammarCompiler`, created lazily."""
        with self._lock:
            if self._compiler is None:
                from detsample.grammar.compiler import GrammarCompiler

                self._compiler = GrammarCompiler(self)
            return self._compiler

    def configure_grammar(self, config) -> Any:
        """Give this vocabulary a :class:`detsample.grammar.GrammarCompiler` built with
        ``config`` (a :class:`~detsample.grammar.GrammarConfig`) and return it: every
        grammar of this vocabulary then compiles under those options. Refused (a
        ``ValueError``) once the vocabulary has a compiler, whose compilations, names and
        pool were built under other options."""
        with self._lock:
            if self._compiler is not None:
                raise ValueError(
                    "this Vocabulary already has a grammar compiler; configure it before its first grammar"
                )
            from detsample.grammar.compiler import GrammarCompiler

            self._compiler = GrammarCompiler(self, config)
            return self._compiler
