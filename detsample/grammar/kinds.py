"""Dispatch one grammar kind to the xgrammar compile call that handles it."""

from __future__ import annotations

import json

from detsample.errors import GrammarError
from detsample.grammar.config import GRAMMAR_KINDS, GrammarConfig
from detsample.grammar.ebnf import correct_json_grammar
from detsample.grammar.schema import prepare_json_schema


def check_kind(kind: str) -> str:
    """The kind itself, or a :class:`GrammarError` naming the valid kinds."""
    if kind not in GRAMMAR_KINDS:
        raise GrammarError(f"grammar kind must be one of {GRAMMAR_KINDS}, got {kind!r}")
    return kind


def grammar_text(kind: str, value: object) -> str:
    """The text of a grammar value; dicts become JSON with their key order kept
    (xgrammar emits object properties in the schema's declared order)."""
    check_kind(kind)
    if isinstance(value, (dict, bool)) and kind in ("json_schema", "structural_tag"):
        return json.dumps(value)
    if not isinstance(value, str):
        raise GrammarError(f"{kind} must be a str, got {type(value).__name__}")
    return value


def json_schema_grammar(text: str, config: GrammarConfig):
    """The ``xgrammar.Grammar`` detsample compiles for a JSON schema: the schema checked
    and rewritten (:func:`~detsample.grammar.schema.prepare_json_schema`), lowered by
    xgrammar, then corrected (:func:`~detsample.grammar.ebnf.correct_json_grammar`)."""
    import xgrammar as xgr

    prepared = prepare_json_schema(text, strict=config.strict_mode)
    kw = {"max_whitespace_cnt": config.max_whitespace_cnt} if config.any_whitespace else {}
    raw = xgr.Grammar.from_json_schema(
        json.dumps(prepared.schema), any_whitespace=config.any_whitespace, strict_mode=config.strict_mode, **kw
    )
    return xgr.Grammar.from_ebnf(correct_json_grammar(str(raw), prepared.patterns))


def grammar_source(kind: str, text: str, config: GrammarConfig, grammar=None) -> str | None:
    """The grammar of ``kind``/``text`` as xgrammar prints it before compiling (the text
    :class:`~detsample.grammar.statekeys.StateKeys` reads), or None for structural tags.
    ``grammar``: a JSON schema's :func:`json_schema_grammar` when the caller has it."""
    import xgrammar as xgr

    check_kind(kind)
    if kind == "json_schema":
        return str(grammar if grammar is not None else json_schema_grammar(text, config))
    if kind == "regex":
        return str(xgr.Grammar.from_regex(text))
    if kind == "ebnf":
        return str(xgr.Grammar.from_ebnf(text))
    return None


def compile_kind(xgr_compiler, kind: str, text: str, config: GrammarConfig, grammar=None):
    """Compile ``text`` as ``kind`` with an ``xgrammar.GrammarCompiler`` (may raise).
    ``grammar``: a JSON schema's :func:`json_schema_grammar` when the caller has it."""
    check_kind(kind)
    if kind == "json_schema":
        return xgr_compiler.compile_grammar(grammar if grammar is not None else json_schema_grammar(text, config))
    if kind == "regex":
        return xgr_compiler.compile_regex(text)
    if kind == "ebnf":
        return xgr_compiler.compile_grammar(text)
    return xgr_compiler.compile_structural_tag(text)
