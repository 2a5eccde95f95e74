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

Memory: the names (the NFA, the interned states, a transition memo) and every cached
row are entries of the vocabulary's :class:`~detsample.grammar.budget.CacheBudget`;
:attr:`StateKeys.nbytes` estimates the first (an upper bound of what Python allocates
for them, checked by the tests), each row costs its words plus ``ROW_OVERHEAD``. When
the budget evicts the names they are retired (:meth:`~StateKeys.retire`): their rows are
dropped, and requests holding them stop naming (their rows are filled by xgrammar
until the grammar is named again).

Which rows are kept: with ``keep_first`` (``mask_cache_policy="eager"``) every named
state's first fill; otherwise (``"recurring"``) a state's row is kept the second time
the state is filled -- a later step, or a second row in it in one step
(:meth:`StateKeys.offer`): a state seen once costs a set entry, not a row.

What is left unnamed (filled by xgrammar every time, as before): a text that ends
inside a multi-byte UTF-8 character, text that is not valid UTF-8, grammars this reader
does not expand (``Unsupported``), and states past ``MAX_STATES`` or of more than
``MAX_STATE_NODES`` nodes.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence

import numpy as np

from detsample.grammar.budget import ROW_OVERHEAD, CacheBudget
from detsample.grammar.ebnf_nfa import NFA, Unsupported, build_nfa

#: The state of a text that has no name (see the module docstring); stays unnamed.
UNNAMED = -1
#: Bound on the named states of one grammar; later states are unnamed.
MAX_STATES = 100_000
#: Bound on the NFA nodes of one state (a highly ambiguous grammar); larger ones are
#: unnamed, so following a text never costs more than this many nodes a byte.
MAX_STATE_NODES = 4096
#: (state, byte) transitions kept before the memo is cleared.
BYTE_MEMO = 1 << 16
#: Estimated bytes of one interned state besides its node set (the key tuple, the sid,
#: the dict and list slots), of one memo entry and of one once-filled state's set entry.
STATE_OVERHEAD = 256
MEMO_ENTRY = 128
ONCE_ENTRY = 96
#: The names report their growth to the budget in steps of this many bytes.
_REPORT_STEP = 64 << 10


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


def nfa_bytes(nfa: NFA) -> int:
    """An upper estimate of the bytes an :class:`~detsample.grammar.ebnf_nfa.NFA` holds
    (its three node lists, their entries, the labels' tuples and ints)."""
    size = sum(sys.getsizeof(x) for x in (nfa.label, nfa.succ, nfa.eps))
    seen: set[int] = set()
    for lab, eps in zip(nfa.label, nfa.eps):
        size += sys.getsizeof(eps) + 32 * (len(eps) + 1)  # (+1: the successor's int)
        if lab is not None and id(lab) not in seen:
            seen.add(id(lab))
            size += sys.getsizeof(lab) + sum(sys.getsizeof(r) + 64 for r in lab)
    return size


class StateKeys:
    """The state names of one compiled grammar and the bitmask rows filled for them.

    Shared by every request of the grammar (thread-safe). Build with :meth:`build`.

    Args:
        nfa, start: from :func:`~detsample.grammar.ebnf_nfa.build_nfa`.
        token_bytes: each token's bytes as xgrammar decodes them (``TokenizerInfo
            .decoded_vocab``; one list shared by every grammar of a vocabulary).
        stop_ids: tokens that end the grammar (accepting one leaves the name as it is).
        width: int32 words of a bitmask row.
        verify: the masker fills named rows with xgrammar too and raises on a difference.
        keep_first: keep a state's row at its first fill (else at its second, see
            :meth:`offer`).
        budget, budget_key: the budget the names (under ``budget_key``, a ``("names",
            ...)`` key its owner adds) and the rows (``("row", self, sid)``) charge;
            None: unbounded (tests).
    """

    def __init__(
        self,
        nfa: NFA,
        start: int,
        token_bytes: Sequence[bytes],
        stop_ids: Sequence[int],
        width: int,
        verify: bool = False,
        *,
        keep_first: bool = True,
        budget: CacheBudget | None = None,
        budget_key: tuple | None = None,
    ) -> None:
        self._nfa = nfa
        self._tokens = token_bytes
        self._stop = frozenset(int(t) for t in stop_ids)
        self.width = width
        self.verify = verify
        self.keep_first = keep_first
        self.retired = False
        self._budget, self._budget_key = budget, budget_key
        self._lock = threading.Lock()
        self._ids: dict[tuple[frozenset, bytes], int] = {}
        self._states: list[tuple[frozenset, bytes]] = []
        self._byte: dict[int, int] = {}  # sid << 8 | byte -> sid
        self._masks: dict[int, np.ndarray] = {}
        self._once: set[int] = set()  # named states filled once, their row not kept
        self._bytes = sys.getsizeof(self) + nfa_bytes(nfa)
        self._reported = 0
        self.start = self._intern(nfa.closure([start]), b"")

    @classmethod
    def build(
        cls,
        grammar_text: str,
        token_bytes: Sequence[bytes],
        stop_ids: Sequence[int],
        width: int,
        verify: bool = False,
        **kw,
    ) -> StateKeys | None:
        """Keys of a printed grammar (``str(xgrammar.Grammar)``), or None when the reader
        does not expand it. ``kw``: the keyword arguments of the constructor."""
        try:
            nfa, start = build_nfa(grammar_text)
        except (Unsupported, RecursionError):
            return None
        return cls(nfa, start, token_bytes, stop_ids, width, verify, **kw)

    # -- memory ---------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Estimated bytes of the names (NFA, states, memo; rows not included)."""
        return self._bytes

    def reported(self, nbytes: int) -> None:
        """The owner charged the budget ``nbytes`` for the names (when adding them)."""
        self._reported = nbytes

    def touch(self) -> None:
        """Mark the names used in the budget (the masker does, once a step)."""
        if self._budget is not None:
            self._budget.touch(self._budget_key)

    def _report(self) -> None:
        """Charge the budget for the names' growth (in steps of ``_REPORT_STEP``)."""
        if self._budget is not None and abs(self._bytes - self._reported) >= _REPORT_STEP:
            self._reported = self._bytes
            self._budget.resize(self._budget_key, self._bytes)

    def retire(self, _token: object = None) -> None:
        """Drop the rows and the memo and stop naming new states (evicted from the
        budget): requests holding these keys drop them (``RequestGrammar.mask_state``)."""
        with self._lock:
            self.retired = True
            rows, self._masks = list(self._masks), {}
            self._byte.clear()
            self._once.clear()
        if self._budget is not None:
            for sid in rows:
                self._budget.discard(("row", self, sid))

    # -- names ----------------------------------------------------------------------
    def _intern(self, nodes: frozenset, partial: bytes) -> int:
        key = (nodes, partial)
        sid = self._ids.get(key)
        if sid is not None:
            return sid
        with self._lock:
            sid = self._ids.get(key)
            if sid is None:
                if len(self._states) >= MAX_STATES or self.retired:
                    return UNNAMED
                sid = len(self._states)
                self._states.append(key)
                self._ids[key] = sid
                self._bytes += STATE_OVERHEAD + sys.getsizeof(nodes) + (sys.getsizeof(partial) if partial else 0)
        self._report()
        return sid

    def _step_byte(self, sid: int, b: int) -> int:
        k = sid << 8 | b
        nxt = self._byte.get(k)
        if nxt is None:
            nxt = self._advance(sid, b)
            if len(self._byte) >= BYTE_MEMO:
                self._bytes -= MEMO_ENTRY * len(self._byte)
                self._byte.clear()
            self._byte[k] = nxt
            self._bytes += MEMO_ENTRY
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
    def mask(self, sid: int) -> np.ndarray | None:
        """The cached bitmask row of state ``sid`` ((W,) int32, read only), or None.
        Marks the row (and the names) used in the budget."""
        row = self._masks.get(sid)
        if row is not None and self._budget is not None:
            self._budget.touch(("row", self, sid))
        return row

    def offer(self, sid: int, row, recurs: bool = False) -> bool:
        """xgrammar filled ``row`` ((W,) int32, torch or numpy) for state ``sid``: keep a
        copy when the state recurs -- ``recurs`` (another row is in it in this step), or
        it was filled before, or ``keep_first`` -- and none is kept yet. Returns whether
        a row is kept for ``sid`` now."""
        if not self.named(sid) or self.retired:
            return False
        if sid in self._masks:
            return True
        if not (recurs or self.keep_first or sid in self._once):
            with self._lock:
                if sid not in self._once:
                    self._once.add(sid)
                    self._bytes += ONCE_ENTRY
            return False
        words = np.asarray(row)
        if words.shape != (self.width,):
            return False
        copy = np.array(words, dtype=np.int32, copy=True)
        copy.flags.writeable = False
        with self._lock:
            if self.retired or sid in self._masks:
                return not self.retired
            self._masks[sid] = copy
            if sid in self._once:
                self._once.discard(sid)
                self._bytes -= ONCE_ENTRY
        if self._budget is not None:
            self._budget.add(("row", self, sid), copy.nbytes + ROW_OVERHEAD, self._drop_row, (sid, copy))
        return True

    def _drop_row(self, token: tuple[int, np.ndarray]) -> None:
        """Budget eviction of one row (only if it is still the row kept for its state)."""
        sid, row = token
        with self._lock:
            if self._masks.get(sid) is row:
                del self._masks[sid]

    @property
    def num_rows(self) -> int:
        """Rows kept now."""
        return len(self._masks)
