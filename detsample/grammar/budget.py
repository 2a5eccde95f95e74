"""One byte budget for the grammar caches of a vocabulary, least recently used first out.

A :class:`~detsample.grammar.GrammarCompiler` (one per vocabulary) owns one
:class:`CacheBudget` of ``GrammarConfig.cache_bytes``. Three kinds of entry charge it,
across every grammar of the vocabulary (:data:`KINDS`):

* ``"compiled"`` -- a finished compilation: :data:`COMPILED_FACTOR` times
  ``xgrammar.CompiledGrammar.memory_size_bytes`` plus :data:`COMPILED_OVERHEAD` and its
  text (a failed one: the overhead, its text and its message);
* ``"names"`` -- a grammar's state names (:class:`~detsample.grammar.statekeys.StateKeys`:
  its NFA, interned states, transition memo; an estimate that grows as it is used);
* ``"row"`` -- one cached bitmask row of one named state (its int32 words plus
  :data:`ROW_OVERHEAD`).

An entry is charged when it is made, resized when it grows and moved to the most
recent end when it is used; whenever the total passes the budget, entries are evicted
from the least recently used end until it fits (the entry being charged last, so an
entry larger than the whole budget is evicted at once). Eviction calls the entry's
``on_evict(token)`` -- its owner drops it (a compiled grammar leaves the compile cache,
names are retired with their rows, a row leaves its state's cache) -- and whatever is
evicted is rebuilt on demand: recompiled, renamed, refilled by xgrammar, with the same
bits (each is a pure function of the grammar text, the vocabulary and the state).

Memory held by requests in flight (their matchers, a compiled grammar or names an
evicted entry leaves in their hands until they finish) is not counted: it is bounded by
the batch, not by the number of grammars.

Locking: ``on_evict`` runs after the budget's lock is released, in the thread that
caused the eviction. So an owner must not call :meth:`CacheBudget.add` or
:meth:`CacheBudget.resize` (which may evict) while it holds a lock an ``on_evict``
takes; :meth:`touch` and :meth:`discard` never evict and are safe anywhere.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

#: The entry kinds (first element of every key).
KINDS = ("compiled", "names", "row")
#: A compiled grammar is charged this many times the size xgrammar reports for it:
#: ``memory_size_bytes`` counts the masks' contents, not the allocator's overhead or the
#: vectors' spare capacity. Measured at V = 128,256 (RSS growth per compiled copy over
#: xgrammar's figure, 60 copies in a fresh process, 9 schemas from the corpus and the
#: benchmarks): 0.8x to 2.6x.
COMPILED_FACTOR = 3
#: Bytes charged on top of a compiled grammar's own size (its Python wrapper, the
#: future that holds it, the compile-cache entry).
COMPILED_OVERHEAD = 2048
#: Bytes charged on top of a cached row's int32 words (the numpy array object, its
#: dict and budget entries).
ROW_OVERHEAD = 512


@dataclass
class BudgetStats:
    """A snapshot of a :class:`CacheBudget`: bytes and entries charged per kind, the
    budget, and evictions per kind since it was made."""

    max_bytes: int
    bytes: int
    by_kind: dict[str, int] = field(default_factory=dict)
    entries: dict[str, int] = field(default_factory=dict)
    evictions: dict[str, int] = field(default_factory=dict)


class CacheBudget:
    """A thread-safe LRU ledger of byte sizes under one budget.

    Keys are tuples whose first element is one of :data:`KINDS`. ``max_bytes`` >= 0.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        # key -> [nbytes, on_evict, token]
        self._entries: OrderedDict[tuple, list] = OrderedDict()
        self._bytes = 0
        self._by_kind = dict.fromkeys(KINDS, 0)
        self._count = dict.fromkeys(KINDS, 0)
        self._evictions = dict.fromkeys(KINDS, 0)

    @property
    def bytes(self) -> int:
        """Bytes charged now (<= ``max_bytes`` whenever no call is in progress)."""
        return self._bytes

    def add(self, key: tuple, nbytes: int, on_evict: Callable[[object], None], token: object = None) -> None:
        """Charge ``nbytes`` for ``key`` (replacing an entry of that key, without calling
        its ``on_evict``), as the most recently used entry; evict to fit."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._account(key, -old[0], -1)
            self._entries[key] = [int(nbytes), on_evict, token]
            self._account(key, int(nbytes), 1)
            victims = self._shrink()
        _run(victims)

    def resize(self, key: tuple, nbytes: int) -> None:
        """Charge ``key`` ``nbytes`` now (it grew or shrank) and mark it used; evict to
        fit. Nothing happens when ``key`` has no entry (it was evicted)."""
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                return
            self._account(key, int(nbytes) - e[0], 0)
            e[0] = int(nbytes)
            self._entries.move_to_end(key)
            victims = self._shrink()
        _run(victims)

    def touch(self, key: Hashable) -> None:
        """Mark ``key`` most recently used (no-op when it has no entry)."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)

    def discard(self, key: Hashable) -> None:
        """Drop ``key``'s entry without calling its ``on_evict`` (its owner dropped it)."""
        with self._lock:
            e = self._entries.pop(key, None)
            if e is not None:
                self._account(key, -e[0], -1)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def stats(self) -> BudgetStats:
        with self._lock:
            return BudgetStats(
                self.max_bytes, self._bytes, dict(self._by_kind), dict(self._count), dict(self._evictions)
            )

    # -- internals (under the lock) ------------------------------------------------------
    def _account(self, key: tuple, nbytes: int, count: int) -> None:
        self._bytes += nbytes
        self._by_kind[key[0]] += nbytes
        self._count[key[0]] += count

    def _shrink(self) -> list[tuple[Callable, object]]:
        victims = []
        while self._bytes > self.max_bytes and self._entries:
            key, (nbytes, on_evict, token) = self._entries.popitem(last=False)
            self._account(key, -nbytes, -1)
            self._evictions[key[0]] += 1
            victims.append((on_evict, token))
        return victims


def _run(victims: list[tuple[Callable, object]]) -> None:
    for on_evict, token in victims:
        on_evict(token)
