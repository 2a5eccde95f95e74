"""Grammar backend options (a frozen, validated dataclass)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from detsample.errors import InvalidSamplingParams

#: The grammar kinds, named as the SamplingParams fields that carry them.
GRAMMAR_KINDS = ("json_schema", "regex", "ebnf", "structural_tag")
#: Default byte budget of a vocabulary's grammar caches (sized for a worker).
DEFAULT_CACHE_BYTES = 512 << 20
#: When a grammar's states are named and a state's row is kept (see GrammarConfig).
MASK_CACHE_POLICIES = ("recurring", "eager")


@dataclass(frozen=True)
class GrammarConfig:
    """Options of a :class:`~detsample.grammar.GrammarCompiler`.

    Attributes:
        any_whitespace: JSON schemas allow free whitespace between tokens. Off by default:
            with it, unconstrained logits can emit whitespace forever.
        max_whitespace_cnt: bound on consecutive whitespace when ``any_whitespace`` is on
            (None = unbounded).
        strict_mode: JSON schemas forbid properties/items the schema does not name.
        compile_timeout_s: how long a sampling step waits for an unready grammar before
            that request fails with a timeout error; None waits for the compilation
            however long it takes (what a run whose output must not depend on the
            machine's speed needs: the golden scenarios).
        max_workers: threads of the compile pool.
        xgrammar_threads: threads xgrammar itself may use per compilation.
        mask_cache: name matcher states (:mod:`detsample.grammar.statekeys`) and fill a
            state's bitmask row once; later rows in that state copy it. Same bits as
            filling every row (the masks are a function of the state).
        mask_cache_policy: where the names and rows are built. ``"recurring"`` (the
            default): a grammar is named once it recurs -- a second request submits it
            while it is cached -- in the compile pool, off the sampling path (its
            requests adopt the names when they are ready); a named state's row is kept
            once the state recurs (filled a second time, or two rows in it in one step).
            A grammar seen once costs exactly xgrammar's own path. ``"eager"``: every
            grammar is named as part of its compilation and every named state's first
            fill is kept (tests that check every cached row use it).
        cache_bytes: one byte budget, least recently used first out, shared by the
            compiled grammars, the state names and the cached rows of every grammar of
            the compiler's vocabulary (:mod:`detsample.grammar.budget`); what is evicted
            is rebuilt on demand with the same bits. 0 keeps nothing past its use.
        verify_mask_cache: also fill every cached row with xgrammar and raise
            :class:`~detsample.errors.GrammarError` on a difference (tests; costs the
            fills the cache saves).
    """

    any_whitespace: bool = False
    max_whitespace_cnt: int | None = None
    strict_mode: bool = True
    compile_timeout_s: float | None = 30.0
    max_workers: int = 2
    xgrammar_threads: int = 1
    mask_cache: bool = True
    verify_mask_cache: bool = False
    mask_cache_policy: str = "recurring"
    cache_bytes: int = DEFAULT_CACHE_BYTES

    def __post_init__(self) -> None:
        t = self.compile_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or math.isnan(t) or t < 0):
            raise InvalidSamplingParams(f"compile_timeout_s must be None or a number >= 0, got {t!r}")
        for name in ("max_workers", "xgrammar_threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidSamplingParams(f"{name} must be an integer >= 1, got {v!r}")
        for name in ("any_whitespace", "strict_mode", "mask_cache", "verify_mask_cache"):
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise InvalidSamplingParams(f"{name} must be a bool, got {v!r}")
        if self.mask_cache_policy not in MASK_CACHE_POLICIES:
            raise InvalidSamplingParams(
                f"mask_cache_policy must be one of {MASK_CACHE_POLICIES}, got {self.mask_cache_policy!r}"
            )
        c = self.cache_bytes
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise InvalidSamplingParams(f"cache_bytes must be an integer >= 0, got {c!r}")
        w = self.max_whitespace_cnt
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise InvalidSamplingParams(f"max_whitespace_cnt must be None or >= 1, got {w!r}")
