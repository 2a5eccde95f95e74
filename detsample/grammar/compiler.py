"""Compile cache and thread pool: grammars compile off the sampling path.

``GrammarCompiler.submit(kind, text)`` returns a :class:`concurrent.futures.Future` of an
``xgrammar.CompiledGrammar``. Futures are cached by ``(kind, text, vocab.fingerprint)``:
the second request with the same grammar shares the compiled grammar (never a matcher).
A failed compilation is cached too (its future holds the exception), so a broken grammar
is not recompiled on every request. Hits, misses, failures and compile times are counted
in :class:`CompileStats`.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from detsample.grammar.config import GrammarConfig
from detsample.grammar.kinds import (check_kind, compile_kind, grammar_source,
                                     json_schema_grammar)
from detsample.grammar.statekeys import StateKeys


@dataclass
class CompileStats:
    """Counters of a :class:`GrammarCompiler` (a snapshot copy is returned by ``stats``).

    ``compile_seconds`` holds the wall time of each finished compilation, in order.
    """

    hits: int = 0
    misses: int = 0
    failures: int = 0
    compile_seconds: list[float] = field(default_factory=list)

    @property
    def compiled(self) -> int:
        return len(self.compile_seconds)

    @property
    def total_compile_seconds(self) -> float:
        return sum(self.compile_seconds)


class GrammarCompiler:
    """Owns a compile pool, an ``xgrammar.GrammarCompiler`` and the compiled-grammar cache.

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
        self._keys: dict[tuple[str, str, str], StateKeys | None] = {}
        self._stats = CompileStats()
        self._pool: ThreadPoolExecutor | None = None
        self._xgr = None

    # -- lifecycle -------------------------------------------------------------------
    def _xgr_compiler(self):
        with self._init_lock:
            if self._xgr is None:
                import xgrammar as xgr

                self._xgr = xgr.GrammarCompiler(self.vocab.xgrammar_tokenizer_info(),
                                                max_threads=self.config.xgrammar_threads,
                                                cache_enabled=False)
            return self._xgr

    def close(self) -> None:
        """Shut the pool down (running compilations finish; queued ones are cancelled)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "GrammarCompiler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- compile ---------------------------------------------------------------------
    def key(self, kind: str, text: str) -> tuple[str, str, str]:
        return (check_kind(kind), text, self.vocab.fingerprint)

    def submit(self, kind: str, text: str) -> Future:
        """A future of the compiled grammar (cached; compiles in the pool on a miss)."""
        key = self.key(kind, text)
        with self._lock:
            fut = self._cache.get(key)
            if fut is not None and not fut.cancelled():  # close() cancels queued ones
                self._stats.hits += 1
                return fut
            self._stats.misses += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.config.max_workers,
                                                thread_name_prefix="detsample-grammar")
            fut = self._pool.submit(self._compile, kind, text)
            self._cache[key] = fut
            return fut

    def _compile(self, kind: str, text: str):
        t0 = time.perf_counter()
        try:
            # a JSON schema is checked, lowered and corrected once, for both uses
            grammar = json_schema_grammar(text, self.config) if kind == "json_schema" else None
            compiled = compile_kind(self._xgr_compiler(), kind, text, self.config, grammar)
            keys = self._build_keys(kind, text, grammar) if self.config.mask_cache else None
            with self._lock:
                self._keys[self.key(kind, text)] = keys
            return compiled
        except BaseException:
            with self._lock:
                self._stats.failures += 1
            raise
        finally:
            dt = time.perf_counter() - t0
            with self._lock:
                self._stats.compile_seconds.append(dt)

    def _build_keys(self, kind: str, text: str, grammar=None) -> StateKeys | None:
        """The state names of a grammar that compiled (None when not expandable). Never
        raises: naming states only saves fills, so it must not fail a grammar that
        compiled (its rows are then filled by xgrammar every step)."""
        try:
            source = grammar_source(kind, text, self.config, grammar)
            if source is None:
                return None
            info = self.vocab.xgrammar_tokenizer_info()
            return StateKeys.build(source, info.decoded_vocab, info.stop_token_ids,
                                   (self.vocab.vocab_size + 31) // 32,
                                   verify=self.config.verify_mask_cache)
        except Exception:  # noqa: BLE001 -- see the docstring
            return None

    def state_keys(self, kind: str, text: str) -> StateKeys | None:
        """The :class:`~detsample.grammar.statekeys.StateKeys` of a grammar once it
        compiled (None before, on failure, with ``mask_cache`` off, or when the grammar
        is not expandable: its rows are then filled by xgrammar every step)."""
        with self._lock:
            return self._keys.get(self.key(kind, text))

    def compile(self, kind: str, text: str, timeout: float | None = None):
        """Blocking convenience: ``submit(kind, text).result(timeout)``."""
        return self.submit(kind, text).result(timeout)

    @property
    def stats(self) -> CompileStats:
        """A snapshot of the counters."""
        with self._lock:
            s = self._stats
            return CompileStats(s.hits, s.misses, s.failures, list(s.compile_seconds))

    def cache_size(self) -> int:
        with self._lock:
            return len(self._cache)

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()
            self._keys.clear()
