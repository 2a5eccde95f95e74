"""Fill and apply the grammar bitmask of a batch (pipeline step 4).

One :class:`GrammarMasker` (owned by a Sampler) keeps one bitmask buffer, grown when a
larger batch or vocabulary arrives, and an ``xgrammar.BatchGrammarMatcher`` that fills
the active rows in parallel. Only rows whose grammar is active are filled and masked;
every other row's logits are untouched, bit for bit.

Three things keep the step cheap at large batch:

* a matcher state's bitmask row is filled once: rows whose grammar names its states
  (:mod:`~detsample.grammar.statekeys`; by default a grammar that recurs) copy the row
  kept for their state (by default once the state recurs, in the vocabulary's byte
  budget), and rows of one step in one state are filled once;

* :meth:`GrammarMasker.masked_step` writes the masked logits into a persistent buffer
  (:class:`~detsample.grammar.maskbuffer.MaskedLogitsBuffer`) at the cost of the columns
  that change, and returns the rows' maxima so the sampler need not reduce again;
* :meth:`GrammarMasker.prefetch` starts the next step's bitmask fill in a background
  thread right after ``batch.advance`` (``Sampler.prefetch_grammar``), so it overlaps
  the model's forward pass; the next fill takes the prefetched rows (waiting for them)
  and fills only what is missing. The bits are the same either way: a fill is a pure
  function of the matcher state, and a matcher that changed since its prefetch started
  (rollback, another token) is filled again.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Sequence

import torch

from detsample.errors import GrammarError
from detsample.grammar.maskbuffer import MaskedLogitsBuffer
from detsample.grammar.request import PENDING, RequestGrammar
from detsample.ops.mask import allocate_token_bitmask, apply_token_bitmask_, bitmask_width, masked_logits


def resolve_all(grammars: Sequence[RequestGrammar | None]) -> None:
    """Wait for every pending grammar together, bounded by their longest timeout (none
    when one has none); a grammar not ready by then fails (its request only)."""
    pending = [g for g in grammars if g is not None and g.state == PENDING]
    if not pending:
        return
    timeouts = [g.timeout_s for g in pending]
    cf.wait([g.future for g in pending], timeout=None if None in timeouts else max(timeouts))
    for g in pending:
        g.resolve(timeout=0.0)


def _by_state(grammars: Sequence, rows) -> tuple[list, list, list, dict]:
    """Split ``rows`` by their grammar's named state: ``(to fill, [(row, cached words)],
    [(row, an earlier row of the same state to copy once it is filled)], {row:
    (StateKeys, state id)} of every named row)``. One cache lookup per state; each
    grammar's names are marked used once."""
    todo, hits, copies, first, named, looked, used = [], [], [], {}, {}, {}, set()
    for r in rows:
        ns = grammars[r].mask_state()
        if ns is not None:
            named[r] = ns
            keys, sid = ns
            k = (id(keys), sid)
            if k not in looked:
                if id(keys) not in used:
                    used.add(id(keys))
                    keys.touch()
                looked[k] = keys.mask(sid)
            hit = looked[k]
            if hit is not None:
                hits.append((r, hit))
                continue
            src = first.setdefault(k, r)
            if src != r:
                copies.append((r, src))
                continue
        todo.append(r)
    return todo, hits, copies, named


def _offer(named: dict, bm: torch.Tensor, rows, copies: list) -> None:
    """Offer the rows xgrammar filled for named states to their cache (a state with a
    copy in this call recurs)."""
    again = {src for _, src in copies}
    for r in rows:
        ns = named.get(r)
        if ns is not None:
            ns[0].offer(ns[1], bm[r], recurs=r in again)


class GrammarMasker:
    """Reusable bitmask buffer + parallel fill + apply (+ background prefetch).

    Args:
        max_threads: threads xgrammar's batch matcher uses to fill rows. "auto": inside
            a step, xgrammar's own choice (half the hardware threads: a second thread
            would fight torch's spinning worker threads); for a prefetched fill, torch's
            intra-op thread count when it starts (the sampler's CPU budget, idle while
            the model's forward runs).
        parallel_min_rows: fill sequentially below this many active rows (thread hand-off
            costs more than it saves for one row).
    """

    def __init__(self, max_threads: int | str = "auto", parallel_min_rows: int = 2) -> None:
        if max_threads != "auto" and (
            isinstance(max_threads, bool) or not isinstance(max_threads, int) or max_threads < 1
        ):
            raise ValueError(f"max_threads must be 'auto' or an integer >= 1, got {max_threads!r}")
        self.max_threads = max_threads
        self.parallel_min_rows = parallel_min_rows
        self._bitmask: torch.Tensor | None = None
        self._matchers: dict[tuple[str, int | str], object] = {}  # (role, threads) -> matcher
        self._pool: cf.ThreadPoolExecutor | None = None
        self.buffer = MaskedLogitsBuffer()

    def bitmask(self, batch: int, vocab_size: int) -> torch.Tensor:
        """The reused buffer, as a ``[batch, ceil(V/32)]`` view (contents stale)."""
        w = bitmask_width(vocab_size)
        bm = self._bitmask
        if bm is None or bm.shape[0] < batch or bm.shape[1] != w:
            bm = allocate_token_bitmask(max(batch, 1), vocab_size)
            self._bitmask = bm
        return bm[:batch]

    def _threads(self, role: str) -> int | str:
        if self.max_threads != "auto":
            return self.max_threads
        return torch.get_num_threads() if role == "prefetch" else "auto"

    def _matcher(self, role: str, threads: int | str):
        """One ``xgrammar.BatchGrammarMatcher`` per role ("step" or "prefetch": they may
        run at the same time) and thread count."""
        key = (role, threads)
        if key not in self._matchers:
            import xgrammar as xgr

            self._matchers[key] = xgr.BatchGrammarMatcher(threads)
        return self._matchers[key]

    def _fill_rows(self, role: str, threads: int | str, grammars: list, bm: torch.Tensor, rows: list[int]) -> None:
        if len(rows) < self.parallel_min_rows:
            for r in rows:
                grammars[r].matcher.fill_next_token_bitmask(bm, r)
        else:
            self._matcher(role, threads).batch_fill_next_token_bitmask([grammars[r].matcher for r in rows], bm, rows)

    def fill(self, grammars: Sequence[RequestGrammar | None], vocab_size: int) -> tuple[torch.Tensor, list[int]]:
        """Fill the bitmask rows of the active grammars; ``(bitmask, filled_rows)``.

        ``grammars[r]`` is row r's grammar or None. Pending grammars are waited for
        (bounded); failed/terminated ones are skipped. Rows prefetched for the current
        matcher state are copied (after waiting for their fill); so are rows whose named
        state has a cached row, and rows in the state of an earlier row of this call;
        the others are filled by xgrammar (and cached under their state's name).
        """
        resolve_all(grammars)
        bm = self.bitmask(len(grammars), vocab_size)
        bmn = bm.numpy()
        rows = [r for r, g in enumerate(grammars) if g is not None and g.is_active]
        rest, checked, pre_named = [], [], {}
        for r in rows:
            g = grammars[r]
            pre = g.take_prefetched()
            if pre is None or pre.shape[0] != bm.shape[1]:
                rest.append(r)
                continue
            bm[r].copy_(pre)
            ns = g.mask_state()
            if ns is not None:
                pre_named.setdefault((id(ns[0]), ns[1]), []).append((r, ns))
                checked.append((r, ns))
        for members in pre_named.values():
            for r, (keys, sid) in members:
                keys.offer(sid, bm[r], recurs=len(members) > 1)
        todo, hits, copies, named = _by_state(grammars, rest)
        for r, hit in hits:
            bmn[r] = hit
        if todo:
            self._fill_rows("step", self._threads("step"), list(grammars), bm, todo)
        _offer(named, bm, todo, copies)
        for r, src in copies:
            bm[r].copy_(bm[src])
        checked += [(r, named[r]) for r, _ in hits + copies]
        self._verify(grammars, bm, checked)
        return bm, rows

    def _verify(self, grammars, bm: torch.Tensor, checked: list[tuple[int, tuple]]) -> None:
        """With ``verify_mask_cache``: fill the rows whose bits were copied (``(row,
        (StateKeys, state id))`` pairs) again with xgrammar and raise on any difference."""
        sids = {r: ns[1] for r, ns in checked if ns[0].verify}
        rows = sorted(sids)
        if not rows:
            return
        fresh = torch.empty((len(grammars), bm.shape[1]), dtype=torch.int32)
        self._fill_rows("step", self._threads("step"), list(grammars), fresh, rows)
        for r in rows:
            if not torch.equal(fresh[r], bm[r]):
                g = grammars[r]
                raise GrammarError(
                    f"request {g.rid!r}: cached bitmask row of state {sids[r]} "
                    f"differs from xgrammar's fill after {len(g.accepted)} tokens"
                )

    def prefetch(self, grammars: Sequence[RequestGrammar | None]) -> int:
        """Start filling the next bitmask row of every active grammar in a background
        thread; returns how many. The next :meth:`fill` (or :meth:`masked_step`) uses
        them. Pending, terminated and failed grammars are left to that fill."""
        active = [g for g in grammars if g is not None and g.is_active]
        if not active:
            return 0
        w = bitmask_width(active[0].vocab.vocab_size)
        rows = torch.empty((len(active), w), dtype=torch.int32)
        for g in active:
            g._settle()  # an earlier prefetch of the same matcher must finish first
        todo, hits, copies, _ = _by_state(active, range(len(active)))
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="detsample-bitmask")
        fut = self._pool.submit(self._prefetch_rows, self._threads("prefetch"), active, rows, todo, hits, copies)
        for i, g in enumerate(active):
            g.set_prefetch(fut, rows, i)
        return len(active)

    def _prefetch_rows(
        self,
        threads: int | str,
        active: list,
        rows: torch.Tensor,
        todo: list[int],
        hits: list[tuple[int, object]],
        copies: list[tuple[int, int]],
    ) -> None:
        """The background part of :meth:`prefetch`: cached rows copied, the others
        filled (one per state), rows sharing a state copied from the filled one."""
        words = rows.numpy()
        for i, hit in hits:
            words[i] = hit
        if todo:
            self._fill_rows("prefetch", threads, active, rows, todo)
        for i, src in copies:
            rows[i].copy_(rows[src])

    def wait_prefetched(self, grammars: Sequence[RequestGrammar | None]) -> None:
        """Block until the background fills of ``grammars`` are done (benchmarks)."""
        for g in grammars:
            if g is not None:
                g._settle()

    def close(self) -> None:
        """Stop the prefetch thread (a running fill finishes)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _fill_for(
        self, logits: torch.Tensor, grammars: Sequence[RequestGrammar | None]
    ) -> tuple[torch.Tensor | None, list[int], int]:
        sizes = {g.vocab.vocab_size for g in grammars if g is not None}
        if not sizes:
            return None, [], logits.shape[1]
        if len(sizes) > 1:
            raise GrammarError(f"grammars of one batch must share a vocabulary size, got {sorted(sizes)}")
        n = sizes.pop()
        if n > logits.shape[1]:
            raise GrammarError(f"grammar vocabulary has {n} tokens, more than the logits' {logits.shape[1]}")
        bm, rows = self.fill(grammars, n)
        return bm, rows, n

    def masked(
        self, logits: torch.Tensor, grammars: Sequence[RequestGrammar | None], out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[int]]:
        """``(masked copy of logits, masked rows)``; ``logits`` itself when no row has an
        active grammar. The bitmask covers the grammars' vocabulary (n tokens); when the
        model's V is larger (an embedding padded past the tokenizer), ids n..V-1 are -inf
        on the masked rows. ``out``: optional result buffer (must not alias ``logits``)."""
        bm, rows, n = self._fill_for(logits, grammars)
        if not rows:
            return logits, rows
        return masked_logits(logits, bm, rows, limit=n, out=out), rows

    def masked_step(
        self,
        logits: torch.Tensor,
        grammars: Sequence[RequestGrammar | None],
        row_max: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[int], torch.Tensor | None, tuple | None]:
        """:meth:`masked` for the sampler: ``(masked, rows, maxima, allowed)``.

        On CPU float32 the result is the masker's persistent buffer (valid until the
        next call; finite values may be added to it in place, nothing else written) and,
        when ``row_max`` ((B, 1) maxima of ``logits``) is given, ``maxima`` are
        ``torch.amax(masked, -1)`` without a pass over the whole batch; ``allowed`` is
        ``(columns, values)``: ``{row: allowed columns}`` (int64 numpy, ascending) of
        masked rows whose result is ``-inf`` outside them (the sparse and select rows)
        and ``{row: masked's float32 values there}`` (:attr:`MaskedLogitsBuffer.columns`,
        :attr:`~MaskedLogitsBuffer.values`). Elsewhere :meth:`masked` (into ``out``),
        ``maxima`` and ``allowed`` None. Same bits either way.
        """
        bm, rows, n = self._fill_for(logits, grammars)
        if not rows:
            return logits, rows, row_max, None
        if not self.buffer.supports(logits):
            return masked_logits(logits, bm, rows, limit=n, out=out), rows, None, None
        x, m = self.buffer.apply(logits, bm, rows, n, row_max)
        return x, rows, m, (self.buffer.columns, self.buffer.values)

    def apply_(self, logits: torch.Tensor, grammars: Sequence[RequestGrammar | None]) -> list[int]:
        """In-place variant of :meth:`masked`; returns the masked rows."""
        bm, rows, n = self._fill_for(logits, grammars)
        if rows:
            apply_token_bitmask_(logits, bm, rows, limit=n)
        return rows
