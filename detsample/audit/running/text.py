"""The rollout's text side: a local tokenizer (a ``tokenizer.json`` file, or a Hugging Face
model directory's tokenizer files), prompts rendered by its own chat template, and stop
strings.

:func:`load_text_tokenizer` reads a tokenizer from local files only (no hub, no remote
code). :class:`TextTokenizer` encodes text without special tokens (a rendered chat prompt
already holds its own), decodes ids with the special tokens kept (so a stop string may
name one), and renders ``messages`` with ``apply_chat_template(...,
add_generation_prompt=True)``; a tokenizer without a template is a named error.

:func:`stop_string_cut`: how many response tokens a stop string keeps. The response is cut
after the token whose decoded text first contains one of the strings (that token is kept,
as vLLM keeps it in ``token_ids``; later tokens are dropped, never masked in). Only the
response is searched, never the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detsample.errors import InvalidSamplingParams


@dataclass(frozen=True)
class TextTokenizer:
    """A loaded tokenizer: ``source`` (the path given), ``fast`` (a ``tokenizers.Tokenizer``)
    and, from a directory, ``hf`` (the transformers tokenizer, for its chat template)."""

    source: str
    fast: Any
    hf: Any = None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added; a text the tokenizer cannot
        encode (a WordLevel vocabulary without an unknown token meeting an unknown word) is
        an :class:`~detsample.errors.InvalidSamplingParams` naming the tokenizer."""
        try:
            return list(self.fast.encode(text, add_special_tokens=False).ids)
        except Exception as exc:  # noqa: BLE001 - the tokenizers library raises bare Exception
            raise InvalidSamplingParams(
                f"the tokenizer {self.source} cannot encode the text {text!r:.60}: {exc}"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens kept."""
        return self.fast.decode(list(ids), skip_special_tokens=False)

    def render_chat(self, messages: object, where: str) -> str:
        """``messages`` (a list of ``{"role", "content"}``) through the tokenizer's own chat
        template with the generation prompt; errors name ``where`` (file:line)."""
        _check_messages(messages, where)
        if self.hf is None or not getattr(self.hf, "chat_template", None):
            raise InvalidSamplingParams(
                f"{where}: the tokenizer {self.source} has no chat template (give a model "
                f"directory whose tokenizer_config.json or chat_template.jinja holds one, or "
                f"prompt / prompt_ids without --chat-template)"
            )
        try:
            return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - a template error is the row's, named
            raise InvalidSamplingParams(
                f"{where}: the chat template failed on these messages ({type(exc).__name__}: {exc})"
            ) from None


def _check_messages(messages: object, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidSamplingParams(
            f"{where}: messages must be a non-empty list of {{'role', 'content'}} objects, got {messages!r:.60}"
        )
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InvalidSamplingParams(
                f"{where}: messages[{k}] must be an object with string role and content, got {m!r:.60}"
            )


def load_text_tokenizer(path: str) -> TextTokenizer:
    """The tokenizer of ``path``: a ``tokenizer.json`` file, or a directory holding one
    (its transformers tokenizer too, for the chat template); local files only."""
    from tokenizers import Tokenizer

    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise InvalidSamplingParams(
            f"tokenizer: no such file {str(file)!r}"
            if not p.is_dir()
            else f"tokenizer: directory {path} has no tokenizer.json"
        )
    try:
        fast = Tokenizer.from_file(str(file))
    except Exception as exc:  # noqa: BLE001 - a bad file is named, whatever the parser says
        raise InvalidSamplingParams(f"tokenizer {file}: cannot read it ({exc})") from None
    return TextTokenizer(str(path), fast, _hf_tokenizer(p) if p.is_dir() else None)


def _hf_tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - named in one line
        raise InvalidSamplingParams(f"tokenizer {directory}: cannot load it ({type(exc).__name__}: {exc})") from None


def check_stop_strings(stop: Sequence[str]) -> tuple[str, ...]:
    """The stop strings as a tuple; an empty one is an error naming it."""
    out = tuple(stop)
    for s in out:
        if not isinstance(s, str) or not s:
            raise InvalidSamplingParams(f"stop strings must be non-empty strings, got {s!r}")
    return out


def stop_string_hit(tok: TextTokenizer, response_ids: Sequence[int], stop: Sequence[str]) -> bool:
    """Whether the decoded ``response_ids`` contain one of the ``stop`` strings (the
    engine's test after each token: the first token that makes it true ends the response)."""
    text = tok.decode(list(response_ids))
    return any(s in text for s in stop)


def stop_string_cut(tok: TextTokenizer, response_ids: Sequence[int], stop: Sequence[str]) -> int:
    """Tokens of ``response_ids`` to keep: up to and including the first token after which
    the decoded response contains a stop string; all of them when none appears (the
    same token :func:`stop_string_hit` asked after each token ends at)."""
    if stop:
        for k in range(1, len(response_ids) + 1):
            if stop_string_hit(tok, response_ids[:k], stop):
                return k
    return len(response_ids)
