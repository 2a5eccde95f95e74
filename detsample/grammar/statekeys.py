"""Names for grammar matcher states, so a bitmask row is filled once per state.

xgrammar's bitmask fill costs up to ~1 ms a row at V = 152k when many tokens need a
run-time check (digits with punctuation attached, inside a number), and xgrammar 0.2.x
exposes no key of a matcher's state to cache it by. :class:`StateKeys` names states
itself: it reads the grammar detsample hands xgrammar into a codepoint NFA whose nodes
are grammar positions, one per derivation path (:mod:`detsample.grammar.ebnf_nfa`), and
follows each request's accepted bytes through it. A state's name is the set of NFA
nodes the accepted text can be in (and acceptance), interned as an int.

Why a name fixes the bitmask: xgrammar's fill is the union, over the parser items
waiting for a character, of the tokens its per-item cache accepts, plus the item's
uncertain tokens that the parser can advance through. The items are a function of the
NFA nodes (every node is one position on one derivation path, finer than an item), and
whether a token's bytes can be consumed depends only on the future language of the
accepted text, which the node set fixes. So two matchers with one name get the same
bits; the first fill of a name is xgrammar's, later ones copy it. The tests fill every
step both ways over the schema corpus (``GrammarConfig(verify_mask_cache=True)``).

What is left unnamed (filled by xgrammar every time, as before): a text that ends
inside a multi-byte UTF-8 character, text that is not valid UTF-8, grammars this reader
does not expand (``Unsupported``), and states past ``MAX_STATES`` or of more than
``MAX_STATE_NODES`` nodes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

import torch

from detsample.grammar.ebnf_nfa import NFA, Unsupported, build_nfa

#: The state of a text that has no name (see the module docstring); stays unnamed.
UNNAMED = -1
#: Bound on the named states of one grammar; later states are unnamed.
MAX_STATES = 100_000
#: Bound on the NFA nodes of one state (a highly ambiguous grammar); larger ones are
#: unnamed, so following a text never costs more than this many nodes a byte.
MAX_STATE_NODES = 4096
#: Bytes of bitmask rows kept per grammar (least recently used dropped first).
MASK_CACHE_BYTES = 16 << 20
_BYTE_MEMO = 1 << 20  # (state, byte) transitions kept before the memo is cleared


def _utf8_length(lead: int) -> int:
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


class StateKeys:
    """The state names of one compiled grammar and the bitmask rows filled for them.

    Shared by every request of the grammar (thread-safe). Build with :meth:`build`.

    Args:
        nfa, start: from :func:`~detsample.grammar.ebnf_nfa.build_nfa`.
        token_bytes: each token's bytes as xgrammar decodes them (``TokenizerInfo
            .decoded_vocab``).
        stop_ids: tokens that end the grammar (accepting one leaves the name as it is).
        width: int32 words of a bitmask row.
        verify: the masker fills named rows with xgrammar too and raises on a difference.
    """

    def __init__(self, nfa: NFA, start: int, token_bytes: Sequence[bytes],
                 stop_ids: Sequence[int], width: int, verify: bool = False) -> None:
        self._nfa = nfa
        self._tokens = token_bytes
        self._stop = frozenset(int(t) for t in stop_ids)
        self.width = width
        self.verify = verify
        self._lock = threading.Lock()
        self._ids: dict[tuple[frozenset, bytes], int] = {}
        self._states: list[tuple[frozenset, bytes]] = []
        self._byte: dict[tuple[int, int], int] = {}
        self._masks: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.max_masks = max(16, MASK_CACHE_BYTES // (4 * width))
        self.start = self._intern(nfa.closure([start]), b"")

    @classmethod
    def build(cls, grammar_text: str, token_bytes: Sequence[bytes], stop_ids: Sequence[int],
              width: int, verify: bool = False) -> "StateKeys | None":
        """Keys of a printed grammar (``str(xgrammar.Grammar)``), or None when the reader
        does not expand it."""
        try:
            nfa, start = build_nfa(grammar_text)
        except (Unsupported, RecursionError):
            return None
        return cls(nfa, start, token_bytes, stop_ids, width, verify)

    # -- names ----------------------------------------------------------------------
    def _intern(self, nodes: frozenset, partial: bytes) -> int:
        key = (nodes, partial)
        sid = self._ids.get(key)
        if sid is not None:
            return sid
        with self._lock:
            sid = self._ids.get(key)
            if sid is None:
                if len(self._states) >= MAX_STATES:
                    return UNNAMED
                sid = len(self._states)
                self._states.append(key)
                self._ids[key] = sid
            return sid

    def _step_byte(self, sid: int, b: int) -> int:
        nxt = self._byte.get((sid, b))
        if nxt is None:
            nxt = self._advance(sid, b)
            if len(self._byte) >= _BYTE_MEMO:
                self._byte.clear()
            self._byte[(sid, b)] = nxt
        return nxt

    def _advance(self, sid: int, b: int) -> int:
        nodes, partial = self._states[sid]
        part = partial + bytes((b,))
        need = _utf8_length(part[0])
        if need == 0 or (len(part) > 1 and not 0x80 <= b <= 0xBF):
            return UNNAMED
        if len(part) < need:
            return self._intern(nodes, part)
        try:
            cp = ord(part.decode("utf-8"))
        except UnicodeDecodeError:
            return UNNAMED
        nxt = self._nfa.step(nodes, cp)
        return self._intern(nxt, b"") if 0 < len(nxt) <= MAX_STATE_NODES else UNNAMED

    def step(self, sid: int, tid: int) -> int:
        """The name after accepting token ``tid`` in state ``sid``."""
        if tid in self._stop:
            return sid
        for b in self._tokens[tid]:
            if sid == UNNAMED:
                break
            sid = self._step_byte(sid, b)
        return sid

    def named(self, sid: int) -> bool:
        """True when ``sid`` names a state whose bitmask row may be cached."""
        return sid != UNNAMED and not self._states[sid][1]

    @property
    def num_states(self) -> int:
        return len(self._states)

    # -- bitmask rows ---------------------------------------------------------------
    def mask(self, sid: int) -> torch.Tensor | None:
        """The cached bitmask row of state ``sid`` ((W,) int32), or None."""
        row = self._masks.get(sid) if self.named(sid) else None
        if row is None:
            return None
        try:
            self._masks.move_to_end(sid)
        except KeyError:  # dropped by another thread meanwhile
            pass
        return row

    def store(self, sid: int, row: torch.Tensor) -> None:
        """Keep a copy of the bitmask row xgrammar filled in state ``sid`` (kept as it
        is when one is cached already)."""
        if not self.named(sid) or row.shape != (self.width,) or sid in self._masks:
            return
        copy = row.clone()
        with self._lock:
            self._masks[sid] = copy
            while len(self._masks) > self.max_masks:
                self._masks.popitem(last=False)
