"""One request's grammar state: a compile future, then an xgrammar matcher.

States (``RequestGrammar.state``):

* ``"pending"``    -- the grammar is still compiling (a future).
* ``"active"``     -- a matcher exists; the request's bitmask row is filled each step.
* ``"terminated"`` -- the matcher accepted a stop token; the grammar stops masking and
  the request is finished.
* ``"failed"``     -- compilation failed, timed out, or the request's existing output was
  rejected; ``error`` holds the message. The grammar stops masking; the request is
  finished with that error. Neighbouring requests are never affected.

Matchers are never shared: each request owns one, built from a (shared, immutable)
compiled grammar.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Sequence

from detsample.errors import GrammarError
from detsample.grammar.kinds import check_kind, grammar_text

PENDING, ACTIVE, TERMINATED, FAILED = "pending", "active", "terminated", "failed"
_PREFIX_SHOWN = 200  # bytes of accepted prefix quoted in error messages


class RequestGrammar:
    """The grammar matcher of one request (row).

    Args:
        rid: request id (named in every error).
        kind: one of ``GRAMMAR_KINDS``.
        future: a future of an ``xgrammar.CompiledGrammar`` (from ``GrammarCompiler``).
        vocab: the :class:`~detsample.Vocabulary` the grammar was compiled for.
        output_ids: tokens the request already generated; fed to the matcher when it is
            built (a rejected one fails the request).
        timeout_s: bound on one wait for the compilation (None: wait until it ends).
        state_keys: returns the grammar's
            :class:`~detsample.grammar.statekeys.StateKeys`, or None while it has none
            (never waits); with keys the request names its matcher states, and the
            masker fills a state's bitmask row once (:meth:`mask_state`).
    """

    def __init__(
        self,
        rid: str,
        kind: str,
        future: cf.Future,
        vocab,
        *,
        output_ids: Sequence[int] = (),
        timeout_s: float | None = 30.0,
        state_keys: Callable[[], object] | None = None,
        reasoning_end: int | None = None,
    ) -> None:
        self.rid = rid
        self.kind = check_kind(kind)
        self.vocab = vocab
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self._future = future
        self._matcher = None
        self._initial = [int(t) for t in output_ids]
        # require_reasoning: dormant (no mask, no tokens fed) until reasoning_end is seen;
        # the tokens up to and including it are not the grammar's
        self.reasoning_end = reasoning_end
        self.dormant = reasoning_end is not None
        self._woke_by_token = False
        if self.dormant and reasoning_end in self._initial:
            self._initial = self._initial[self._initial.index(reasoning_end) + 1 :]
            self.dormant = False
        elif self.dormant:
            self._initial = []
        self.accepted: list[int] = []
        self.state = PENDING
        self.error: str | None = None
        self._prefetch = None  # (future, (n, W) int32 rows, row, version) of a background fill
        self._version = 0  # bumped on every matcher change: a prefetched row is for one version
        self._state_keys = state_keys
        self._keys = None  # StateKeys once active
        self._sids: list[int] = []  # state name after each accepted token (and before all)

    @classmethod
    def from_params(
        cls, rid: str, params, vocab, *, output_ids: Sequence[int] = (), compiler=None, reasoning_end: int | None = None
    ) -> RequestGrammar | None:
        """The grammar of ``params`` (None when it has none), submitted for compilation."""
        g = params.grammar
        if g is None:
            return None
        kind = g[0]
        # The raw field value, not params.grammar's text: a dict keeps its key order.
        return cls.submit(
            rid,
            kind,
            getattr(params, kind),
            vocab,
            output_ids=output_ids,
            compiler=compiler,
            reasoning_end=reasoning_end,
        )

    @classmethod
    def submit(
        cls,
        rid: str,
        kind: str,
        value,
        vocab,
        *,
        output_ids: Sequence[int] = (),
        compiler=None,
        reasoning_end: int | None = None,
    ) -> RequestGrammar:
        """Submit ``value`` (str, or dict for JSON kinds) to ``compiler`` (default: the
        vocabulary's) and wrap the future. An unknown kind raises :class:`GrammarError`."""
        if vocab is None:
            raise GrammarError(
                f"request {rid!r} has a {kind} grammar but the batch has no "
                "vocabulary; pass vocab= to SamplingBatch.from_requests"
            )
        compiler = compiler if compiler is not None else vocab.grammar_compiler
        if compiler.vocab.fingerprint != vocab.fingerprint:
            raise GrammarError(f"request {rid!r}: the grammar compiler belongs to another vocabulary")
        text = grammar_text(kind, value)
        fut = compiler.submit(kind, text)
        return cls(
            rid,
            kind,
            fut,
            vocab,
            output_ids=output_ids,
            timeout_s=compiler.config.compile_timeout_s,
            state_keys=compiler.names_getter(kind, text),
            reasoning_end=reasoning_end,
        )

    # -- state -----------------------------------------------------------------------
    @property
    def is_active(self) -> bool:
        return self.state == ACTIVE

    @property
    def ready(self) -> bool:
        """True unless the compilation is still running (never waits)."""
        return self.state != PENDING or self._future.done()

    @property
    def failed(self) -> bool:
        return self.state == FAILED

    @property
    def future(self) -> cf.Future:
        return self._future

    def is_terminated(self) -> bool:
        """True once a stop token was accepted (the request is finished)."""
        return self.state == TERMINATED

    def fail(self, message: str) -> None:
        """Enter the error state (stops masking; the request finishes with ``message``)."""
        self._settle()
        self.state = FAILED
        self.error = message
        self._matcher = None
        self._keys, self._sids = None, []

    def fork(self) -> RequestGrammar:
        """An independent copy in the same state (same compile future, a forked matcher):
        feeding or rolling back either never changes the other. ``SamplingBatch.merge``
        forks the merged rows' grammars, as it copies their outputs and penalty counts."""
        self._settle()
        c = RequestGrammar.__new__(RequestGrammar)
        c.rid, c.kind, c.vocab, c.timeout_s = self.rid, self.kind, self.vocab, self.timeout_s
        c._prefetch, c._version = None, 0
        c._future = self._future
        c._matcher = self._matcher.fork() if self._matcher is not None else None
        c._state_keys, c._keys, c._sids = self._state_keys, self._keys, list(self._sids)
        c._initial = list(self._initial)
        c.accepted = list(self.accepted)
        c.state, c.error = self.state, self.error
        c.reasoning_end, c.dormant = self.reasoning_end, self.dormant
        c._woke_by_token = self._woke_by_token
        return c

    def resolve(self, timeout: float | None = None) -> str:
        """Wait (at most ``timeout``, default ``timeout_s``; with neither, until the
        compilation ends) for the compilation and build the matcher. Never raises: failure
        or timeout becomes the ``"failed"`` state."""
        if self.state != PENDING:
            return self.state
        timeout = self.timeout_s if timeout is None else timeout
        try:
            compiled = self._future.result(timeout=timeout)
        except cf.TimeoutError:
            waited = timeout if self.timeout_s is None else max(timeout, self.timeout_s)
            self.fail(f"request {self.rid!r}: {self.kind} grammar did not compile within {waited:g} s")
            return self.state
        except cf.CancelledError:
            self.fail(f"request {self.rid!r}: {self.kind} grammar compilation was cancelled")
            return self.state
        except Exception as e:  # noqa: BLE001 -- any compile error fails this request only
            self.fail(f"request {self.rid!r}: {self.kind} grammar failed to compile: {type(e).__name__}: {e}")
            return self.state
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(compiled)
        self.state = ACTIVE
        self._adopt_keys()
        for tid in self._initial:
            if not self._matcher.accept_token(tid):
                self.fail(self._reject_message(tid, "existing output token"))
                break
            self._accepted(tid)
            if self._matcher.is_terminated():
                self.state = TERMINATED
                break
        self._initial = []
        return self.state

    def _require_matcher(self, what: str):
        self.resolve()
        if self._matcher is None:
            raise GrammarError(
                f"request {self.rid!r}: cannot {what}: grammar is "
                f"{self.state}" + (f" ({self.error})" if self.error else "")
            )
        return self._matcher

    @property
    def matcher(self):
        """The xgrammar ``GrammarMatcher`` (resolving the compilation first)."""
        return self._require_matcher("use the matcher")

    def _accepted(self, tid: int) -> None:
        self.accepted.append(tid)
        if self._keys is not None:
            self._sids.append(self._keys.step(self._sids[-1], tid))

    def _adopt_keys(self):
        """Take the grammar's names if they are ready (never waits) and name the
        accepted text by replaying it; None (and no names held) when there are none."""
        self._keys, self._sids = None, []
        keys = self._state_keys() if self._state_keys is not None else None
        if keys is None or keys.retired:
            return None
        sids = [keys.start]
        for tid in self.accepted:
            sids.append(keys.step(sids[-1], tid))
        self._keys, self._sids = keys, sids
        return keys

    def mask_state(self):
        """``(StateKeys, state id)`` naming the matcher's current state when the grammar
        has keys and the state is named (its bitmask row may be cached), else None.

        Names built after this request became active (the ``"recurring"`` policy names a
        grammar in the background) are adopted here; retired ones (evicted from the
        budget) are dropped, and the grammar's new names adopted when there are some."""
        if self.state != ACTIVE:
            return None
        keys = self._keys
        if keys is None or keys.retired:
            keys = self._adopt_keys()
            if keys is None:
                return None
        sid = self._sids[-1]
        return (keys, sid) if keys.named(sid) else None

    def _reject_message(self, tid: int, what: str = "token") -> str:
        prefix = self.vocab.decode(self.accepted)
        shown = prefix if len(prefix) <= _PREFIX_SHOWN else b"..." + prefix[-_PREFIX_SHOWN:]
        tok = self.vocab.tokens[tid] if 0 <= tid < self.vocab.vocab_size else None
        return (
            f"request {self.rid!r}: {self.kind} grammar rejected {what} {tid} ({tok!r}) "
            f"after accepted prefix {shown!r} ({len(self.accepted)} tokens)"
        )

    # -- background fill (prefetch) --------------------------------------------------
    def set_prefetch(self, future: cf.Future, rows, row: int) -> None:
        """A background fill writes this request's next bitmask into ``rows[row]``
        (``future`` completes when it has). Every matcher change waits for it first."""
        self._settle()
        self._prefetch = (future, rows, row, self._version)

    def take_prefetched(self):
        """The prefetched bitmask row for the current state (waiting for the fill), or
        None when there is none or the matcher changed since it was started."""
        pre, self._prefetch = self._prefetch, None
        if pre is None:
            return None
        future, rows, row, version = pre
        try:
            future.result()
        except Exception:  # noqa: BLE001 -- the caller fills the row itself
            return None
        return rows[row] if version == self._version and self.state == ACTIVE else None

    def _settle(self) -> None:
        """Wait for an in-flight background fill of this matcher (it must not change
        under the fill)."""
        if self._prefetch is not None:
            cf.wait([self._prefetch[0]])

    def _changed(self) -> None:
        self._settle()
        self._version += 1

    # -- per step --------------------------------------------------------------------
    def fill_bitmask(self, bitmask, row: int) -> bool:
        """Write this request's allowed-token bits into ``bitmask[row]``.

        ``bitmask`` is a ``[B, ceil(V/32)]`` int32 CPU tensor. Returns True when the row
        was filled (the grammar is active); False (row untouched) otherwise.
        """
        if self.resolve() != ACTIVE:
            return False
        self._settle()
        self._matcher.fill_next_token_bitmask(bitmask, row)
        return True

    def accept_token(self, tid: int) -> None:
        """Advance the matcher by one token.

        Raises:
            GrammarError: the grammar rejects the token (a bug: the mask forbade it) or
                is not active; the message names the request and the accepted prefix.
        """
        m = self._require_matcher("accept a token")
        tid = int(tid)
        if self.state != ACTIVE:
            raise GrammarError(f"request {self.rid!r}: grammar already terminated; cannot accept token {tid}")
        self._changed()
        if not 0 <= tid < self.vocab.vocab_size or not m.accept_token(tid):
            raise GrammarError(self._reject_message(tid))
        self._accepted(tid)
        if m.is_terminated():
            self.state = TERMINATED

    @property
    def progress(self) -> int:
        """Tokens this grammar has taken: the accepted ones, plus 1 once an end-of-thinking
        token woke it (what :meth:`rollback` counts back over)."""
        return len(self.accepted) + int(self._woke_by_token)

    def see_reasoning_token(self, tid: int) -> None:
        """While dormant (require_reasoning): the end-of-thinking token starts the grammar
        (the tokens after it are the grammar's); any other token is reasoning."""
        if self.dormant and int(tid) == self.reasoning_end:
            self.dormant, self._woke_by_token = False, True

    def rollback(self, k: int) -> None:
        """Undo the last ``k`` accepted tokens (a terminated grammar becomes active);
        past the first one, the end-of-thinking token that woke the grammar (it is
        dormant again)."""
        if self._woke_by_token and k == len(self.accepted) + 1:
            if self.accepted:
                self.rollback(len(self.accepted))
            self.dormant, self._woke_by_token = True, False
            return
        m = self._require_matcher("rollback")
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= len(self.accepted):
            raise GrammarError(f"request {self.rid!r}: rollback k must be in [0, {len(self.accepted)}], got {k!r}")
        if k == 0:
            return
        self._changed()
        m.rollback(k)
        del self.accepted[-k:]
        if self._keys is not None:
            del self._sids[-k:]
        self.state = ACTIVE

    def jump_forward(self) -> tuple[int, list[int]]:
        """Append the string the grammar forces next, re-tokenised.

        The forced bytes are appended to the accepted text, the whole text is
        re-encoded with the vocabulary, the matcher is rolled back to the common token
        prefix of the old and new encodings and fed the new tail.

        Returns:
            ``(rolled_back, new_tokens)``: drop the last ``rolled_back`` output tokens of
            the request and append ``new_tokens``. ``(0, [])`` when nothing is forced.
        """
        m = self._require_matcher("jump forward")
        if self.state != ACTIVE:
            return 0, []
        self._settle()
        forced = m.find_jump_forward_string()
        if not forced:
            return 0, []
        old = list(self.accepted)
        new = self.vocab.encode(self.vocab.decode(old) + forced.encode("utf-8"))
        common = 0
        for a, b in zip(old, new):
            if a != b:
                break
            common += 1
        rolled = len(old) - common
        self.rollback(rolled)
        tail = new[common:]
        for tid in tail:
            self.accept_token(tid)
        return rolled, tail

    def __repr__(self) -> str:
        return (
            f"RequestGrammar(rid={self.rid!r}, kind={self.kind!r}, state={self.state!r}, accepted={len(self.accepted)})"
        )
