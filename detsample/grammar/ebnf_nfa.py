"""xgrammar's printed EBNF, read into a codepoint NFA whose nodes are grammar positions.

Used only to *name* matcher states (:mod:`detsample.grammar.statekeys`), never to decide
which tokens a grammar allows: xgrammar does that.

Reads the dialect ``str(xgrammar.Grammar)`` prints: ``name ::= expr`` rules, choices
``|``, sequences, groups, string literals, character classes (``[^...]``, ranges,
escapes), the postfixes ``*`` ``+`` ``?`` ``{m, n}`` (``n = -1``: unbounded) and a
trailing lookahead ``(= ...)`` (dropped: xgrammar's parser does not consume it; it only
sharpens the masks xgrammar precomputes for a rule's positions). Anything else
(``TagDispatch``, ``Regex``, left or nested recursion, a grammar too large to expand)
raises :class:`Unsupported`.

The NFA is built by expanding every rule where it is used, backwards from its
continuation: each use of a rule and each copy of a repeated item gets its own nodes,
so a node stands for one position of one derivation path (a *finer* name than the
parser's item). A right-recursive use (the same rule with the same continuation, as
xgrammar lowers ``x*``) loops back to the use being expanded.
"""

from __future__ import annotations

import re

from detsample.grammar.regex import complement, normalize

#: Expansion bound (nodes); a grammar needing more is not named (its masks are filled
#: as before).
MAX_NODES = 100_000


class Unsupported(Exception):
    """The grammar uses something this reader does not expand."""


# -- lexing -------------------------------------------------------------------------
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-.]*")
_SIMPLE_ESC = {"n": 10, "r": 13, "t": 9, "0": 0, "b": 8, "f": 12, "v": 11, "a": 7, "e": 27}


def _escape(s: str, i: int) -> tuple[int, int]:
    """The codepoint of the escape at ``s[i] == '\\'`` and the index after it."""
    if i + 1 >= len(s):
        raise Unsupported("dangling backslash")
    c = s[i + 1]
    if c in _SIMPLE_ESC:
        return _SIMPLE_ESC[c], i + 2
    for lead, n in (("x", 2), ("u", 4), ("U", 8)):
        if c == lead:
            h = s[i + 2 : i + 2 + n]
            if len(h) != n or not all(ch in "0123456789abcdefABCDEF" for ch in h):
                raise Unsupported(f"bad \\{lead} escape {s[i : i + 2 + n]!r}")
            return int(h, 16), i + 2 + n
    return ord(c), i + 2


def _char(s: str, i: int) -> tuple[int, int]:
    """The codepoint at ``s[i]`` (an escape or a plain character) and the index after."""
    return _escape(s, i) if s[i] == "\\" else (ord(s[i]), i + 1)


def _tokens(text: str) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c == '"':
            cps, i = [], i + 1
            while i < n and text[i] != '"':
                cp, i = _char(text, i)
                cps.append(cp)
            if i >= n:
                raise Unsupported("unterminated string literal")
            out.append(("lit", tuple(cps)))
            i += 1
        elif c == "[":
            i += 1
            neg = i < n and text[i] == "^"
            i += neg
            items: list[int] = []
            while i < n and text[i] != "]":
                cp, i = _char(text, i)
                items.append(cp)
                if i + 1 < n and text[i] == "-" and text[i + 1] != "]":
                    hi, i = _char(text, i + 1)
                    items[-1] = (items[-1], hi)
            if i >= n:
                raise Unsupported("unterminated character class")
            i += 1
            out.append(("class", _ranges(items, neg)))
        elif text.startswith("::=", i):
            out.append(("def", None))
            i += 3
        elif text.startswith("(=", i):
            out.append(("look", None))
            i += 2
        elif c in "()|*+?":
            out.append((c, None))
            i += 1
        elif c == "{":
            m = re.compile(r"\{\s*(\d+)\s*(?:,\s*(-?\d+)\s*)?\}").match(text, i)
            if m is None:
                raise Unsupported(f"bad repetition at {text[i : i + 20]!r}")
            lo = int(m.group(1))
            hi = lo if m.group(2) is None else int(m.group(2))
            out.append(("rep", (lo, hi)))
            i = m.end()
        else:
            m = _NAME.match(text, i)
            if m is None:
                raise Unsupported(f"unexpected {text[i : i + 20]!r}")
            out.append(("name", m.group(0)))
            i = m.end()
    return out


def _ranges(items: list, negated: bool) -> tuple[tuple[int, int], ...]:
    """Sorted disjoint inclusive codepoint ranges of a class."""
    rs = [(x, x) if isinstance(x, int) else x for x in items]
    for lo, hi in rs:
        if lo > hi:
            raise Unsupported(f"empty class range {lo:#x}-{hi:#x}")
    return complement(rs) if negated else normalize(rs)


# -- parsing ------------------------------------------------------------------------
# Expressions: ("lit", cps) ("class", ranges) ("seq", [e]) ("alt", [e]) ("ref", name)
# ("rep", e, lo, hi)


def parse_rules(text: str) -> dict[str, tuple]:
    """``{rule name: expression}`` of a printed grammar (lookaheads dropped)."""
    toks = _tokens(text)
    starts = [i for i in range(len(toks) - 1) if toks[i][0] == "name" and toks[i + 1][0] == "def"]
    if not starts:
        raise Unsupported("no rules")
    rules: dict[str, tuple] = {}
    for k, s in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(toks)
        body = toks[s + 2 : end]
        p = _Parser(body)
        expr = p.alt()
        if p.i < len(body) and body[p.i][0] == "look":
            p.i += 1
            p.alt()
            p.expect(")")
        if p.i != len(body):
            raise Unsupported(f"rule {toks[s][1]}: unexpected {body[p.i]!r}")
        rules[toks[s][1]] = expr
    return rules


class _Parser:
    def __init__(self, toks: list) -> None:
        self.t, self.i = toks, 0

    def peek(self) -> str | None:
        return self.t[self.i][0] if self.i < len(self.t) else None

    def expect(self, kind: str) -> None:
        if self.peek() != kind:
            raise Unsupported(f"expected {kind!r}, got {self.peek()!r}")
        self.i += 1

    def alt(self) -> tuple:
        items = [self.seq()]
        while self.peek() == "|":
            self.i += 1
            items.append(self.seq())
        return items[0] if len(items) == 1 else ("alt", items)

    def seq(self) -> tuple:
        items = []
        while self.peek() in ("lit", "class", "name", "("):
            items.append(self.postfix())
        return items[0] if len(items) == 1 else ("seq", items)

    def postfix(self) -> tuple:
        e = self.atom()
        while self.peek() in ("*", "+", "?", "rep"):
            kind, val = self.t[self.i]
            self.i += 1
            lo, hi = {"*": (0, -1), "+": (1, -1), "?": (0, 1)}.get(kind, val)
            if hi != -1 and hi < lo or lo < 0:
                raise Unsupported(f"bad repetition {{{lo}, {hi}}}")
            e = ("rep", e, lo, hi)
        return e

    def atom(self) -> tuple:
        kind, val = self.t[self.i]
        self.i += 1
        if kind == "lit":
            return ("lit", val)
        if kind == "class":
            return ("class", val)
        if kind == "name":
            return ("ref", val)
        e = self.alt()  # "("
        self.expect(")")
        return e


# -- the NFA ------------------------------------------------------------------------
class NFA:
    """Nodes: a *core* node has a label (codepoint ranges) and one successor; any other
    node has epsilon edges only. ``final`` is the node reached when the root completes
    (a core node with an empty label, so acceptance is part of a node set)."""

    def __init__(self) -> None:
        self.label: list[tuple | None] = []
        self.succ: list[int] = []
        self.eps: list[list[int]] = []
        self.final = self._new(label=())

    def _new(self, label: tuple | None = None, succ: int = -1) -> int:
        if len(self.label) >= MAX_NODES:
            raise Unsupported(f"grammar expands past {MAX_NODES} positions")
        self.label.append(label)
        self.succ.append(succ)
        self.eps.append([])
        return len(self.label) - 1

    def closure(self, nodes) -> frozenset[int]:
        """The core nodes reachable from ``nodes`` by epsilon edges."""
        seen, stack, out = set(), list(nodes), set()
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if self.label[n] is not None:
                out.add(n)
            else:
                stack.extend(self.eps[n])
        return frozenset(out)

    def step(self, nodes: frozenset[int], cp: int) -> frozenset[int]:
        """The node set after codepoint ``cp`` (empty: no derivation continues)."""
        return self.closure([self.succ[n] for n in nodes if _in(cp, self.label[n])])

    def matches(self, start: int, text: str) -> bool:
        """Whether the grammar derives ``text`` (a str of codepoints)."""
        nodes = self.closure([start])
        for ch in text:
            nodes = self.step(nodes, ord(ch))
        return self.final in nodes


def _in(cp: int, ranges: tuple) -> bool:
    """Whether ``cp`` lies in the sorted inclusive ``ranges``."""
    for lo, hi in ranges:
        if cp < lo:
            return False
        if cp <= hi:
            return True
    return False


def build_nfa(text: str, root: str = "root") -> tuple[NFA, int]:
    """``(nfa, start node)`` of a printed grammar."""
    rules = parse_rules(text)
    if root not in rules:
        raise Unsupported(f"no rule {root!r}")
    nfa = NFA()
    active: dict[str, tuple[int, int]] = {}  # rule being expanded -> (continuation, entry)

    def build(e: tuple, nxt: int) -> int:
        kind = e[0]
        if kind == "lit":
            for cp in reversed(e[1]):
                nxt = nfa._new(label=((cp, cp),), succ=nxt)
            return nxt
        if kind == "class":
            return nfa._new(label=e[1], succ=nxt)
        if kind == "seq":
            for item in reversed(e[1]):
                nxt = build(item, nxt)
            return nxt
        if kind == "alt":
            node = nfa._new()
            nfa.eps[node] = [build(item, nxt) for item in e[1]]
            return node
        if kind == "ref":
            name = e[1]
            if name not in rules:
                raise Unsupported(f"undefined rule {name!r}")
            if name in active:
                cont, entry = active[name]
                if cont != nxt:
                    raise Unsupported(f"rule {name!r} recurses other than at its end")
                return entry
            entry = nfa._new()
            active[name] = (nxt, entry)
            try:
                nfa.eps[entry] = [build(rules[name], nxt)]
            finally:
                del active[name]
            return entry
        _, item, lo, hi = e  # "rep"
        if hi == -1:
            loop = nfa._new()
            nfa.eps[loop] = [nxt, build(item, loop)]
            nxt = loop
        else:
            stop = nxt
            for _ in range(hi - lo):  # T_k = stop | item T_(k-1)
                opt = nfa._new()
                nfa.eps[opt] = [stop, build(item, nxt)]
                nxt = opt
        for _ in range(lo):
            nxt = build(item, nxt)
        return nxt

    return nfa, build(("ref", root), nfa.final)
