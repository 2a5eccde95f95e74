"""Compile cache and thread pool: grammars compile off the sampling path.

``GrammarCompiler.submit(kind, text)`` returns a :class:`concurrent.futures.Future` of an
``xgrammar.CompiledGrammar``. Futures are cached by ``(kind, text, vocab.fingerprint)``:
the second request with the same grammar shares the compiled grammar (never a matcher).
A failed compilation is cached too (its future holds the exception), so a broken grammar
is not recompiled on every request. Hits, misses, failures and compile times are counted
in :class:`CompileStats`.

The state names of a grammar (:class:`~detsample.grammar.statekeys.StateKeys`) are built
here too: with ``mask_cache_policy="recurring"`` once the grammar recurs (a compile-cache
hit), as a task of the pool after its compilation; with ``"eager"`` inside the
compilation. Finished compilations, names and the rows the names keep are entries of one
:class:`~detsample.grammar.budget.CacheBudget` of ``GrammarConfig.cache_bytes``
(:attr:`GrammarCompiler.budget`); an evicted compilation leaves the cache (the next
request recompiles it), evicted names are retired (the next recurrence renames it).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from detsample.grammar.budget import COMPILED_FACTOR, COMPILED_OVERHEAD, CacheBudget
from detsample.grammar.config import GrammarConfig
from detsample.grammar.kinds import check_kind, compile_kind, grammar_source, json_schema_grammar
from detsample.grammar.statekeys import StateKeys

#: Compile times kept in :attr:`CompileStats.compile_seconds` (the latest ones).
KEPT_TIMES = 4096


@dataclass
class CompileStats:
    """Counters of a :class:`GrammarCompiler` (a snapshot copy is returned by ``stats``).

    ``compile_seconds`` holds the wall time of the latest (at most ``KEPT_TIMES``)
    finished compilations, in order; ``compiled`` and ``total_compile_seconds`` count
    all of them. ``named``: grammars whose state names were built.
    """

    hits: int = 0
    misses: int = 0
    failures: int = 0
    compile_seconds: list[float] = field(default_factory=list)
    compiled: int = 0
    total_compile_seconds: float = 0.0
    named: int = 0


class GrammarCompiler:
    """Owns a compile pool, an ``xgrammar.GrammarCompiler``, the compiled-grammar cache,
    the state names and their byte budget.

    One per vocabulary (``vocab.grammar_compiler`` creates one lazily) or created by the
    user (``GrammarCompiler(vocab, GrammarConfig(...))``). ``close()`` (or ``with``)
    shuts the pool down. Thread-safe.
    """

    def __init__(self, vocab, config: GrammarConfig | None = None) -> None:
        self.vocab = vocab
        self.config = config if config is not None else GrammarConfig()
        self._lock = threading.Lock()
        self._init_lock = threading.Lock()
        self._cache: dict[tuple[str, str, str], Future] = {}
        # StateKeys | None (not expandable) | a Future of them while they are built
        self._names: dict[tuple[str, str, str], object] = {}
        self._stats = CompileStats()
        self._times: deque[float] = deque(maxlen=KEPT_TIMES)
        self._pool: ThreadPoolExecutor | None = None
        self._xgr = None
        self._token_bytes: list[bytes] | None = None
        #: the byte budget of the compiled grammars, names and rows of this vocabulary
        self.budget = CacheBudget(self.config.cache_bytes)
        #: bumped whenever names are published (a request without names looks again
        #: only then: :meth:`names_getter`)
        self.names_version = 0

    # -- lifecycle -------------------------------------------------------------------
    def _xgr_compiler(self):
        with self._init_lock:
            if self._xgr is None:
                import xgrammar as xgr

                self._xgr = xgr.GrammarCompiler(
                    self.vocab.xgrammar_tokenizer_info(), max_threads=self.config.xgrammar_threads, cache_enabled=False
                )
            return self._xgr

    def token_bytes(self) -> list[bytes]:
        """Each token's bytes as xgrammar sees them (specials ``b""``: the list
        ``Vocabulary.xgrammar_tokenizer_info`` hands it, equal to its ``decoded_vocab``),
        built once and shared by the names of every grammar. (``decoded_vocab`` builds a
        new list of V bytes objects on every read: ~250 ms and ~18 MB at V = 128k.)"""
        with self._init_lock:
            if self._token_bytes is None:
                special = self.vocab.special_ids
                self._token_bytes = [b"" if i in special else t for i, t in enumerate(self.vocab.tokens)]
            return self._token_bytes

    def close(self) -> None:
        """Shut the pool down (running compilations finish; queued ones are cancelled)."""
        with self._lock:
            pool, self._pool = self._pool, None
            queued = list(self._cache.values())
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        for fut in queued:
            fut.cancel()  # (only a queued one: a running or finished one is left)

    def __enter__(self) -> GrammarCompiler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- compile ---------------------------------------------------------------------
    def key(self, kind: str, text: str) -> tuple[str, str, str]:
        return (check_kind(kind), text, self.vocab.fingerprint)

    def submit(self, kind: str, text: str) -> Future:
        """A future of the compiled grammar (cached; compiles in the pool on a miss).
        A hit marks the grammar recurring: with ``mask_cache_policy="recurring"`` its
        state names are built in the pool once it compiled."""
        key = self.key(kind, text)
        with self._lock:
            fut = self._cache.get(key)
            hit = fut is not None and not fut.cancelled()  # close() cancels queued ones
            if hit:
                self._stats.hits += 1
            else:
                self._stats.misses += 1
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=self.config.max_workers, thread_name_prefix="detsample-grammar"
                    )
                fut = Future()
                self._cache[key] = fut
                self._pool.submit(self._run, key, kind, text, fut)
        if not hit:
            return fut
        self.budget.touch(("compiled", key))
        if self.config.mask_cache and self.config.mask_cache_policy == "recurring":
            self._want_names(key, kind, text, fut)
        return fut

    def _compile(self, kind: str, text: str):
        t0 = time.perf_counter()
        try:
            # a JSON schema is checked, lowered and corrected once, for both uses
            grammar = json_schema_grammar(text, self.config) if kind == "json_schema" else None
            compiled = compile_kind(self._xgr_compiler(), kind, text, self.config, grammar)
            if self.config.mask_cache and self.config.mask_cache_policy == "eager":
                self._store_names(self.key(kind, text), None, self._build_keys(kind, text, grammar))
            return compiled
        except BaseException:
            with self._lock:
                self._stats.failures += 1
            raise
        finally:
            dt = time.perf_counter() - t0
            with self._lock:
                self._times.append(dt)
                self._stats.compiled += 1
                self._stats.total_compile_seconds += dt

    def _run(self, key: tuple, kind: str, text: str, fut: Future) -> None:
        """The pool task of a miss: compile, charge the budget, then complete ``fut``
        (so the entry is charged by the time anyone sees the result)."""
        if not fut.set_running_or_notify_cancel():  # cancelled by close()
            return
        try:
            compiled = self._compile(kind, text)
        except BaseException as e:  # noqa: BLE001 -- the future carries it
            self._admit(key, fut, len(str(e)))
            fut.set_exception(e)
            return
        self._admit(key, fut, COMPILED_FACTOR * compiled.memory_size_bytes)
        fut.set_result(compiled)

    def _admit(self, key: tuple, fut: Future, nbytes: int) -> None:
        """Charge a compilation (``nbytes`` besides its overhead and text) to the budget."""
        with self._lock:
            if self._cache.get(key) is not fut:  # cleared meanwhile
                return
        self.budget.add(
            ("compiled", key), COMPILED_OVERHEAD + 4 * len(key[1]) + nbytes, self._evict_compiled, (key, fut)
        )

    def _evict_compiled(self, token: tuple) -> None:
        key, fut = token
        with self._lock:
            if self._cache.get(key) is fut:
                del self._cache[key]

    # -- state names -----------------------------------------------------------------
    def _want_names(self, key: tuple, kind: str, text: str, fut: Future) -> None:
        """Schedule the names of a recurring grammar (once; after it compiled)."""
        with self._lock:
            if key in self._names:
                return
            self._names[key] = building = Future()
        fut.add_done_callback(lambda f: self._schedule_names(key, kind, text, f, building))

    def _schedule_names(self, key: tuple, kind: str, text: str, fut: Future, building: Future) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            self._store_names(key, building, None)  # a failure has no names (kept)
            return
        with self._lock:
            pool = self._pool
            ok = pool is not None and not fut.cancelled()
            if ok:
                try:
                    pool.submit(self._store_names, key, building, None, kind, text)
                except RuntimeError:  # the pool was shut down meanwhile
                    ok = False
            if not ok and self._names.get(key) is building:
                del self._names[key]
        if not ok:
            building.set_result(None)

    def _store_names(
        self,
        key: tuple,
        building: Future | None,
        keys: StateKeys | None,
        kind: str | None = None,
        text: str | None = None,
    ) -> None:
        """Publish a grammar's names (None: not expandable) and charge them to the
        budget. ``building``: the future a recurring grammar's entry holds while the
        names are built here (from ``kind`` and ``text``; without them, ``keys`` is
        published); nothing is published when the entry changed meanwhile (cleared).
        None: eager names built with the grammar."""
        if building is not None and kind is not None:
            keys = self._build_keys(kind, text)
        with self._lock:
            old = self._names.get(key)
            current = building is None or old is building
            if current:
                self._names[key] = keys
                self._stats.named += keys is not None
                self.names_version += 1
        if building is not None:
            building.set_result(keys if current else None)
        if not current:
            return
        if isinstance(old, StateKeys):  # (eager names of a recompiled grammar)
            old.retire()
        size = keys.nbytes if keys is not None else COMPILED_OVERHEAD + 4 * len(key[1])
        if keys is not None:
            keys.reported(size)
        self.budget.add(("names", key), size, self._evict_names, (key, keys))

    def _evict_names(self, token: tuple) -> None:
        key, keys = token
        with self._lock:
            if key in self._names and self._names[key] is keys:
                del self._names[key]
        if keys is not None:
            keys.retire()

    def _build_keys(self, kind: str, text: str, grammar=None) -> StateKeys | None:
        """The state names of a grammar that compiled (None when not expandable). Never
        raises: naming states only saves fills, so it must not fail a grammar that
        compiled (its rows are then filled by xgrammar every step)."""
        try:
            source = grammar_source(kind, text, self.config, grammar)
            if source is None:
                return None
            info = self.vocab.xgrammar_tokenizer_info()
            return StateKeys.build(
                source,
                self.token_bytes(),
                info.stop_token_ids,
                (self.vocab.vocab_size + 31) // 32,
                verify=self.config.verify_mask_cache,
                keep_first=self.config.mask_cache_policy == "eager",
                budget=self.budget,
                budget_key=("names", self.key(kind, text)),
            )
        except Exception:  # noqa: BLE001 -- see the docstring
            return None

    def state_keys(self, kind: str, text: str) -> StateKeys | None:
        """The :class:`~detsample.grammar.statekeys.StateKeys` of a grammar once they are
        built (None before -- with the ``"recurring"`` policy, until the grammar recurs
        and its names are ready --, on failure, with ``mask_cache`` off, after an
        eviction, or when the grammar is not expandable: its rows are then filled by
        xgrammar every step). Never waits."""
        with self._lock:
            keys = self._names.get(self.key(kind, text))
        return keys if isinstance(keys, StateKeys) else None

    def names_getter(self, kind: str, text: str):
        """A callable returning :meth:`state_keys` -- or None at once when no names were
        published since its last call (a request without names asks every step; this
        keeps that to an integer compare)."""
        seen = [-1]

        def get() -> StateKeys | None:
            version = self.names_version
            if version == seen[0]:
                return None
            seen[0] = version
            return self.state_keys(kind, text)

        return get

    def wait_names(self, kind: str, text: str, timeout: float | None = None) -> StateKeys | None:
        """:meth:`state_keys`, after waiting (at most ``timeout``) for names being built
        in the background (tests and benchmarks)."""
        with self._lock:
            entry = self._names.get(self.key(kind, text))
        if isinstance(entry, Future):
            entry = entry.result(timeout)
        return entry if isinstance(entry, StateKeys) else None

    def compile(self, kind: str, text: str, timeout: float | None = None):
        """Blocking convenience: ``submit(kind, text).result(timeout)``."""
        return self.submit(kind, text).result(timeout)

    @property
    def stats(self) -> CompileStats:
        """A snapshot of the counters."""
        with self._lock:
            s = self._stats
            return CompileStats(
                s.hits, s.misses, s.failures, list(self._times), s.compiled, s.total_compile_seconds, s.named
            )

    def cache_size(self) -> int:
        """Compilations held by the cache (finished or in flight)."""
        with self._lock:
            return len(self._cache)

    def clear_cache(self) -> None:
        """Drop every compilation and every grammar's names (retired: their requests
        stop naming) and start a new budget."""
        with self._lock:
            names = [k for k in self._names.values() if isinstance(k, StateKeys)]
            self._cache.clear()
            self._names.clear()
            self.budget = CacheBudget(self.config.cache_bytes)
        for keys in names:
            keys.retire()
