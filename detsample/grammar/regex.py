"""JSON-Schema ``pattern`` regexes lowered to grammar rules detsample controls.

jsonschema checks ``pattern`` with Python's ``re.search``. xgrammar compiles a pattern
with its own regex engine into a JSON-string automaton, and that path is not reliable:

* its automaton for some alternations and optional groups is wrong: ``(?:a{0,2}|a)``
  accepts ``aaaa`` and ``a(cb*)?`` accepts ``ab`` (xgrammar 0.2.9);
* ``.``, negated classes and ``\\S`` / ``\\W`` / ``\\D`` admit the UTF-16 surrogates
  U+D800-U+DFFF, whose UTF-8 spelling is not valid UTF-8; its ``\\W`` / ``\\D`` are
  ASCII-based (``\\W`` admits ``é``, which Python's ``\\w`` matches);
* lookarounds are silently ignored;
* a pattern with a non-ASCII character falls back to a grammar that admits raw control
  characters and unescaped quotes.

:func:`pattern_ebnf` therefore parses the pattern with Python's own regex parser (the
validator's parse) and lowers it to an EBNF expression for the *JSON spelling* of the
matching strings: each character class is an explicit list of code-point ranges, minus
the surrogates, where a quote, a backslash or a control character is spelled as its JSON
escape (inside a bounded repetition ``{m,n}`` a class that has other characters keeps
only those: fast masks, still a subset). ``\\d`` / ``\\w`` / ``\\s`` become their ASCII parts;
``\\D`` / ``\\W`` / ``\\S`` and negated classes the exact complement of Python's Unicode sets; anchors at the ends
are dropped (a grammar matches the whole string). Every string the expression spells
therefore decodes to one that ``re.search(pattern, s)`` accepts. Constructs with no
exact translation (backreferences, lookarounds, inline flags, anchors in the middle,
possessive quantifiers, word boundaries) raise :class:`GrammarError`.
"""

from __future__ import annotations

import functools
import json
import re

import numpy as np

from detsample.errors import GrammarError

try:  # Python >= 3.11
    import re._constants as _sre_c  # type: ignore[import-not-found]
    import re._parser as _sre_p  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_c  # type: ignore[no-redef]
    import sre_parse as _sre_p  # type: ignore[no-redef]

MAX_CP = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
_ASCII_SETS = {  # the ASCII part of Python's \d \w \s: used where a subset is safe
    "DIGIT": ((0x30, 0x39),),
    "WORD": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
    "SPACE": ((0x09, 0x0D), (0x20, 0x20)),
}
_FLAG_UNICODE = _sre_c.SRE_FLAG_UNICODE

Ranges = tuple[tuple[int, int], ...]


def normalize(ranges) -> Ranges:
    """Sorted, disjoint, non-adjacent inclusive ranges covering the same code points."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def complement(ranges) -> Ranges:
    """The code points of [0, U+10FFFF] not in ``ranges``."""
    out, nxt = [], 0
    for lo, hi in normalize(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CP:
        out.append((nxt, MAX_CP))
    return tuple(out)


def subtract(a, b) -> Ranges:
    """``a`` minus ``b``."""
    return normalize(_intersect(a, complement(b)))


def _intersect(a, b) -> list[tuple[int, int]]:
    out, i, j = [], 0, 0
    a, b = normalize(a), normalize(b)
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


@functools.cache  # a pure function of the Python version: computed once
def python_class(name: str) -> Ranges:
    """Python's own Unicode set for ``\\d`` / ``\\w`` / ``\\s`` (``name`` DIGIT, WORD,
    SPACE), found by running ``re`` over every code point."""
    esc = {"DIGIT": r"\d+", "WORD": r"\w+", "SPACE": r"\s+"}[name]
    every = np.arange(MAX_CP + 1, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
    return tuple((m.start(), m.end() - 1) for m in re.finditer(esc, every))


def _category(cat: str, negated_context: bool) -> Ranges:
    """The ranges of a category escape. In a negated class the item is excluded, so it
    must cover Python's whole set; elsewhere a subset of Python's set is safe."""
    neg = cat.startswith("CATEGORY_NOT_")
    base = cat[len("CATEGORY_NOT_") :] if neg else cat[len("CATEGORY_") :]
    if base not in _ASCII_SETS:
        raise GrammarError(f"pattern: unsupported class escape {cat}")
    if neg:
        return complement(python_class(base))
    return python_class(base) if negated_context else _ASCII_SETS[base]


_JSON_FORBIDDEN = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))  # spelled as escapes


def _cp(cp: int) -> str:
    """One code point inside an EBNF class or literal."""
    c = chr(cp)
    if c.isascii() and c.isalnum():
        return c
    return f"\\u{cp:04X}" if cp <= 0xFFFF else f"\\U{cp:08X}"


def literal(text: str) -> str:
    """An EBNF string literal spelling ``text``."""
    esc = {"\\": "\\\\", '"': '\\"'}
    return '"' + "".join(esc.get(c, c) if " " <= c <= "~" else _cp(ord(c)) for c in text) + '"'


def class_text(ranges) -> str:
    """An EBNF class of exactly the code points ``ranges``, always written negated
    (``[^complement]``): xgrammar compiles a negated class ~100x faster than the same
    set written positively when it is repeated (``[a-z ]{0,40}``: 4 s against 0.06 s at
    V=152k) and fills its masks faster. ``ranges`` must leave something out."""
    rest = complement(ranges)
    if not rest:
        raise GrammarError("a character class of every code point cannot be written")
    return "[^" + "".join(_cp(lo) if lo == hi else f"{_cp(lo)}-{_cp(hi)}" for lo, hi in rest) + "]"


def json_chars(ranges, escapes: bool = True) -> str | None:
    """EBNF for one character of ``ranges`` in a JSON string: the characters a string
    may hold raw as a class, the others as their JSON escapes (only when ``escapes``, or
    when no raw character is left); None when empty."""
    ranges = subtract(ranges, (SURROGATES,))
    alts = []
    raw = subtract(ranges, _JSON_FORBIDDEN)
    if raw:
        alts.append(class_text(raw))
        if not escapes:
            return alts[0]
    for lo, hi in _intersect(ranges, _JSON_FORBIDDEN):
        if (lo, hi) == _JSON_FORBIDDEN[0]:  # every control character: \u0000-\u001f
            alts.append('("\\\\u00" [01] [0-9A-Fa-f])')
            alts.extend(literal(e) for e in ("\\b", "\\f", "\\n", "\\r", "\\t"))
        else:
            alts.extend(literal(json.dumps(chr(c))[1:-1]) for c in range(lo, hi + 1))
    if not alts:
        return None
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


class _Lowering:
    """Lowers a parse tree. ``bounded`` > 0 inside a bounded repetition: there a class
    keeps only its raw characters (xgrammar precomputes masks for a bounded repetition
    of a plain class, but checks every token at run time, ~300 ms a fill at V=152k, when
    the repeated item also has multi-character escapes)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.bounded = 0

    def fail(self, what: str) -> None:
        raise GrammarError(f"pattern {self.pattern!r}: {what} is not supported by the grammar backend")

    def chars(self, ranges) -> str:
        out = json_chars(ranges, escapes=not self.bounded)
        if out is None:
            self.fail("a character class that matches no character")
        return out

    def seq(self, items, at_start: bool, at_end: bool) -> str:
        items = list(items)
        out = []
        for i, (op, av) in enumerate(items):
            start = at_start and all(self._is_anchor(o, a, "begin") for o, a in items[:i])
            end = at_end and all(self._is_anchor(o, a, "end") for o, a in items[i + 1 :])
            text = self.node(op, av, start, end)
            if text:
                out.append(text)
        return "(" + " ".join(out) + ")" if out else '""'

    @staticmethod
    def _is_anchor(op, av, which: str) -> bool:
        if str(op) != "AT":
            return False
        names = {"begin": ("AT_BEGINNING", "AT_BEGINNING_STRING"), "end": ("AT_END", "AT_END_STRING")}[which]
        return str(av) in names

    def node(self, op, av, at_start: bool, at_end: bool) -> str:
        name = str(op)
        if name == "LITERAL":
            return self.chars(((av, av),))
        if name == "NOT_LITERAL":
            return self.chars(complement(((av, av),)))
        if name == "ANY":
            return self.chars(complement(((0x0A, 0x0A),)))
        if name == "IN":
            return self.in_text(av)
        if name == "CATEGORY":
            return self.chars(_category(str(av), False))
        if name in ("MAX_REPEAT", "MIN_REPEAT"):  # lazy or greedy: the same language
            lo, hi, sub = av
            if hi == _sre_c.MAXREPEAT:
                body = self.seq(sub, False, False)
                return f"{body}*" if lo == 0 else (f"{body}+" if lo == 1 else f"{body}{{{lo},}}")
            self.bounded += 1
            try:
                body = self.seq(sub, False, False)
            finally:
                self.bounded -= 1
            return f"{body}{{{lo},{hi}}}"
        if name == "SUBPATTERN":
            _group, add_flags, del_flags, sub = av
            if add_flags or del_flags:
                self.fail("an inline flag group")
            return self.seq(sub, at_start, at_end)
        if name == "BRANCH":
            _, alts = av
            return "(" + " | ".join(self.seq(a, at_start, at_end) for a in alts) + ")"
        if name == "AT":
            kind = str(av)
            if kind in ("AT_BEGINNING", "AT_BEGINNING_STRING") and at_start:
                return ""  # a grammar matches the whole string: the anchor is implied
            if kind in ("AT_END", "AT_END_STRING") and at_end:
                return ""
            what = {"AT_BOUNDARY": "a word boundary", "AT_NON_BOUNDARY": "a non-boundary"}
            self.fail(what.get(kind, f"the anchor {kind} away from the start or end"))
        names = {
            "GROUPREF": "a backreference",
            "GROUPREF_EXISTS": "a conditional group",
            "ASSERT": "a lookaround",
            "ASSERT_NOT": "a negative lookaround",
            "ATOMIC_GROUP": "an atomic group",
            "POSSESSIVE_REPEAT": "a possessive quantifier",
        }
        self.fail(names.get(name, f"the regex construct {name}"))
        raise AssertionError  # unreachable

    def in_text(self, items) -> str:
        items = list(items)
        negated = bool(items) and str(items[0][0]) == "NEGATE"
        if negated:
            items = items[1:]
        ranges: list[tuple[int, int]] = []
        for op, av in items:
            name = str(op)
            if name == "LITERAL":
                ranges.append((av, av))
            elif name == "RANGE":
                ranges.append(tuple(av))
            elif name == "CATEGORY":
                ranges.extend(_category(str(av), negated))
            else:
                self.fail(f"the class item {name}")
        return self.chars(complement(ranges) if negated else ranges)


def parse_python(pattern: str):
    """Python's parse tree of ``pattern`` (a :class:`GrammarError` if ``re`` rejects it)."""
    if not isinstance(pattern, str):
        raise GrammarError(f"pattern must be a string, got {type(pattern).__name__}")
    try:
        re.compile(pattern)
        return _sre_p.parse(pattern)
    except re.error as e:
        raise GrammarError(f"pattern {pattern!r} is not a valid regular expression: {e}") from None


def pattern_ebnf(pattern: str) -> str:
    """An EBNF expression for the JSON-string body (between the quotes) of the strings
    xgrammar may emit for the JSON-Schema ``pattern`` ``pattern``.

    Raises :class:`GrammarError` naming the construct when the pattern uses one that
    cannot be translated exactly.
    """
    tree = parse_python(pattern)
    if tree.state.flags & ~_FLAG_UNICODE:
        _Lowering(pattern).fail("an inline flag")
    return _Lowering(pattern).seq(tree, True, True)
