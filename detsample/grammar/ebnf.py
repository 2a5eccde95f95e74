"""Corrections to the grammar xgrammar generates for a JSON schema.

xgrammar (0.2.x) lowers a string with ``minLength`` / ``maxLength`` to a bounded
repetition over the character class ``[^"\\\\\\r\\n]``: it admits raw control characters
U+0000-U+001F (which RFC 8259 forbids inside strings, so a strict ``json.loads`` fails
with "Invalid control character") and no escape at all. Every negated class of a JSON
grammar -- free strings included -- also admits the UTF-16 surrogates U+D800-U+DFFF,
whose UTF-8 spelling is not valid UTF-8.

:func:`correct_json_grammar` rewrites the printed grammar (EBNF text):

* every negated character class also excludes ``\\0-\\x1f``, ``"``, ``\\\\`` and the
  surrogates (in a JSON grammar, negated classes only ever match string content);
* the escapes of free strings lose the surrogate ``\\uD800``-``\\uDFFF`` forms (a lone
  surrogate decodes to a string that cannot be encoded as UTF-8);
* a length-bounded string's character rule becomes "one unescaped character or one JSON
  escape" (``\\"``, ``\\\\``, ``\\/``, ``\\b``, ``\\f``, ``\\n``, ``\\r``, ``\\t`` or a
  non-surrogate ``\\uXXXX``): each repetition is exactly one code point of the decoded
  string, so the bounds mean what JSON Schema says (code points).

* ``Regex("<placeholder>", json_string=true)`` nodes become rules holding detsample's
  own lowering of the pattern they stand for (:mod:`detsample.grammar.regex`).

String literals (including ``Regex("...")`` arguments) are copied untouched.
"""

from __future__ import annotations

from detsample.errors import GrammarError

#: Characters no JSON string may hold unescaped, plus the surrogates (xgrammar EBNF syntax).
STRING_EXCLUDE = r'\0-\x1f\"\\\uD800-\uDFFF'
#: The character rule xgrammar 0.2.x prints for a length-bounded string.
LENGTH_RULE_BODY = r'(([^\"\\\r\n]))'
#: The escape rule of free strings: its ``\uXXXX`` admits lone surrogates (``\ud800``),
#: which decode to a string that cannot be encoded as UTF-8.
FREE_ESCAPE_BODY = r'(([\"\\/bfnrt]) | ("u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]))'
ESCAPE_RULE = "detsample_json_escape"
PATTERN_RULE = "detsample_pattern_"
_ESCAPE_BODY = ('(([\\"\\\\/bfnrt]) '
                '| ("u" [0-9A-Ca-cE-Fe-f] [0-9A-Fa-f] [0-9A-Fa-f] [0-9A-Fa-f]) '
                '| ("u" [Dd] [0-7] [0-9A-Fa-f] [0-9A-Fa-f]))')
_ESCAPE_DEF = f"{ESCAPE_RULE} ::= {_ESCAPE_BODY}"
_CHAR_BODY = f'(([^{STRING_EXCLUDE}]) | ("\\\\" {ESCAPE_RULE}))'


def _closing(s: str, i: int, close: str) -> int:
    """Index of the unescaped ``close`` that ends the literal or class opened at ``s[i]``."""
    j = i + 1
    while j < len(s):
        if s[j] == "\\":
            j += 2
        elif s[j] == close:
            return j
        else:
            j += 1
    what = "character class" if close == "]" else "string literal"
    raise GrammarError(f"unterminated {what} in generated grammar: {s[i:i + 80]!r}")


def exclude_from_negated_classes(body: str) -> str:
    """``body`` with :data:`STRING_EXCLUDE` added to every negated class outside literals."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == '"':
            j = _closing(body, i, '"') + 1
            out.append(body[i:j])
            i = j
        elif c == "[":
            j = _closing(body, i, "]")
            cls = body[i:j]
            out.append(cls + STRING_EXCLUDE + "]" if cls.startswith("[^") else cls + "]")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def correct_json_grammar(ebnf: str, patterns: dict[str, str] | None = None) -> str:
    """The corrected EBNF of a JSON-schema grammar printed by xgrammar (one rule a line).

    ``patterns``: placeholder regex -> EBNF expression; each
    ``Regex("<placeholder>", json_string=true)`` becomes a rule with that expression.
    """
    if ESCAPE_RULE in ebnf or PATTERN_RULE in ebnf:
        raise GrammarError(f"generated grammar already uses the names {ESCAPE_RULE!r} or "
                           f"{PATTERN_RULE!r}")
    extra = []
    for i, (ph, expr) in enumerate((patterns or {}).items()):
        ebnf = ebnf.replace(f'Regex("{ph}", json_string=true)', f"({PATTERN_RULE}{i})")
        extra.append(f"{PATTERN_RULE}{i} ::= {expr}")
        if ph in ebnf:
            raise GrammarError(f"pattern placeholder {ph!r} survived in the generated grammar")
    lines, escapes = [], False
    for line in ebnf.splitlines():
        name, sep, body = line.partition(" ::= ")
        if not sep:
            lines.append(line)
        elif body.strip() == LENGTH_RULE_BODY:
            lines.append(f"{name} ::= {_CHAR_BODY}")
            escapes = True
        elif body.strip() == FREE_ESCAPE_BODY:
            lines.append(f"{name} ::= {_ESCAPE_BODY}")
        else:
            lines.append(f"{name} ::= {exclude_from_negated_classes(body)}")
    if escapes:
        lines.append(_ESCAPE_DEF)
    lines.extend(extra)
    return "\n".join(lines) + "\n"
