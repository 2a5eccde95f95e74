"""Corrections to the grammar xgrammar generates for a JSON schema.

xgrammar (0.2.x) lowers a string with ``minLength`` / ``maxLength`` to a bounded
repetition over the character class ``[^"\\\r\n]``: it admits raw control characters
U+0000-U+001F (which RFC 8259 forbids inside strings, so a strict ``json.loads`` fails
with "Invalid control character"). Every negated class of a JSON grammar -- free strings
included -- also admits the UTF-16 surrogates U+D800-U+DFFF, whose UTF-8 spelling is not
valid UTF-8, and free strings admit lone ``\\uD800`` escapes.

:func:`correct_json_grammar` rewrites the printed grammar (EBNF text):

* every negated character class also excludes ``\0-\x1f``, ``"``, ``\\`` and the
  surrogates (in a JSON grammar, negated classes only ever match string content), so a
  length-bounded string is a bounded repetition of one unescaped code point: the bounds
  count code points of the decoded string, as JSON Schema says. It holds no escape (as
  upstream): a repetition whose item is "a character or a multi-character escape" makes
  xgrammar check every token at run time (~300 ms per bitmask fill at V=152k), a plain
  class repetition keeps its precomputed masks;
* the escapes of free strings lose the surrogate forms ``\\uD800``-``\\uDFFF``;
* ``Regex("<placeholder>", json_string=true)`` nodes are replaced by detsample's own
  lowering of the pattern they stand for (:mod:`detsample.grammar.regex`).

String literals (including ``Regex("...")`` arguments) are copied untouched.
"""

from __future__ import annotations

import re

from detsample.errors import GrammarError

#: Characters no JSON string may hold unescaped, plus the surrogates (xgrammar EBNF syntax).
STRING_EXCLUDE = r"\0-\x1f\"\\\uD800-\uDFFF"
#: The escape rule of free strings: its ``\uXXXX`` admits lone surrogates (``\ud800``),
#: which decode to a string that cannot be encoded as UTF-8.
FREE_ESCAPE_BODY = r'(([\"\\/bfnrt]) | ("u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]))'
_ESCAPE_BODY = (
    '(([\\"\\\\/bfnrt]) '
    '| ("u" [0-9A-Ca-cE-Fe-f] [0-9A-Fa-f] [0-9A-Fa-f] [0-9A-Fa-f]) '
    '| ("u" [Dd] [0-7] [0-9A-Fa-f] [0-9A-Fa-f]))'
)


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
    raise GrammarError(f"unterminated {what} in generated grammar: {s[i : i + 80]!r}")


def _segments(body: str):
    """``(kind, text)`` pieces of a rule body: "lit" (a string literal, quotes included),
    "class" (``[...]``) or "other"."""
    i, start = 0, 0
    while i < len(body):
        c = body[i]
        if c in '"[':
            if i > start:
                yield "other", body[start:i]
            j = _closing(body, i, '"' if c == '"' else "]") + 1
            yield ("lit" if c == '"' else "class"), body[i:j]
            i = start = j
        else:
            i += 1
    if start < len(body):
        yield "other", body[start:]


def exclude_from_negated_classes(body: str) -> str:
    """``body`` with :data:`STRING_EXCLUDE` added to every negated class outside literals."""
    return "".join(
        t[:-1] + STRING_EXCLUDE + "]" if k == "class" and t.startswith("[^") else t for k, t in _segments(body)
    )


def _inline(body: str, names: dict[str, str]) -> str:
    """``body`` with every reference to a rule of ``names`` replaced by ``(expression)``."""
    if not names:
        return body
    word = re.compile(r"(?<![\w])(" + "|".join(map(re.escape, names)) + r")(?![\w])")
    return "".join(word.sub(lambda m: f"({names[m.group(1)]})", t) if k == "other" else t for k, t in _segments(body))


def correct_json_grammar(ebnf: str, patterns: dict[str, str] | None = None) -> str:
    """The corrected EBNF of a JSON-schema grammar printed by xgrammar (one rule a line).

    ``patterns``: placeholder regex -> EBNF expression. A rule that is just
    ``Regex("<placeholder>", json_string=true)`` is inlined, as that expression, into the
    rules that use it (xgrammar compiles a bounded repetition ~25x slower when it is the
    whole body of a rule); any other such node is replaced in place.
    """
    rules = []
    for line in ebnf.splitlines():
        name, sep, body = line.partition(" ::= ")
        rules.append((name, body) if sep else (None, line))
    patterns = patterns or {}
    nodes = {f'Regex("{ph}", json_string=true)': expr for ph, expr in patterns.items()}
    inline = {name: nodes[body.strip()] for name, body in rules if name is not None and body.strip() in nodes}
    lines = []
    for name, body in rules:
        if name is None:
            lines.append(body)
            continue
        if name in inline:
            continue
        body = _ESCAPE_BODY if body.strip() == FREE_ESCAPE_BODY else exclude_from_negated_classes(body)
        for node, expr in nodes.items():
            body = body.replace(node, f"({expr})")
        lines.append(f"{name} ::= {_inline(body, inline)}")
    out = "\n".join(lines) + "\n"
    left = [ph for ph in patterns if ph in out]
    if left:
        raise GrammarError(f"pattern placeholders {left} survived in the generated grammar")
    return out
