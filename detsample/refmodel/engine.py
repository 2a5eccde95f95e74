"""Continuous batching over a causal LM, the way a serving engine does it.

The model is any model adapter: the int64 :class:`~detsample.refmodel.model.RefModel`, or
a :class:`detsample.models.CausalLM` (a Hugging Face model behind ``HFCausalLM``, a user's
``module:factory``): ``new_cache()``, the ragged ``forward(caches, chunks)``,
``vocab_size`` and ``max_seq_len`` (None: no limit) are all the engine uses.

Every engine step: requests that arrive at this step (or wait for a free row) are
admitted; ONE ragged model call feeds every running row its last sampled token (decode)
and every admitted row its prompt, or its next chunk of it with ``prefill_chunk``; rows
whose prefill completes join with ``SamplingBatch.merge``; every row samples one token
with the ``Sampler`` (``positions`` = index of the row's last input token);
``batch.advance`` records the tokens; finished rows leave with ``SamplingBatch.filter``.
A request stops on EOS, one of its ``stop_token_ids``, ``max_new_tokens``, the model's
``max_seq_len``, when the batch marks it finished (no admissible token, terminated
grammar), or when ``run``'s ``stop_after`` test says its tokens end it (stop strings). The
token that stops a request is part of its output.

Guarantee (tested): with a batch-invariant model (the reference model; a float model
under ``detsample.batch_invariant()``) a request's tokens, logprobs, seed and finish
reason are bitwise the same alone or in any schedule, and its logprobs equal
:func:`rescore` bitwise. With torch's default kernels they are not (decode rows and
prefill rows round differently): that is what the audit reports.

With ``Engine(..., speculative=Speculative(proposer, k))`` a running row feeds its last
token and up to ``k`` drafted ones in the same ragged call and keeps the drafts its own
draws confirm (:mod:`detsample.refmodel.speculative`): the same tokens and logprobs as the
plain run, bitwise, in fewer steps when the drafts agree.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from detsample.batch import SamplingBatch
from detsample.errors import InvalidSamplingParams
from detsample.params import LOGPROBS_MODES, Request, SamplingParams
from detsample.params.validation import check_request
from detsample.refmodel.cache import KVCache
from detsample.refmodel.schedule import Arrival, Schedule
from detsample.refmodel.speculative import DraftRow, SpecStats, Speculative, check_drafts, check_truncatable
from detsample.refmodel.tokenizer import EOS_ID
from detsample.sampler import Sampler

FINISH_EOS = "eos"
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_MAX_SEQ_LEN = "max_seq_len"


@dataclass(frozen=True)
class EngineConfig:
    """Engine knobs (frozen, validated).

    max_batch_size: requests in flight, sampling or still prefilling (None = unlimited);
    further arrivals wait, first come first served.
    prefill_chunk: prompt tokens a request prefills per step (None = all at once); the
    chunks run in the same ragged model call as the decode rows (chunked prefill).
    default_max_new_tokens: used when a request's ``params.max_new_tokens`` is None.
    extra_logprobs_modes: modes reported besides each request's own ``logprobs_mode``
    (computed with ``Sampler.compute_logprobs`` on a lockstep batch in that mode).
    vocab: the :class:`~detsample.Vocabulary` grammars are compiled for; None = the
    default vocabulary when the model has its 512-token layout.
    think_end_token_id: the end-of-thinking token after which the grammar of a
    ``require_reasoning`` request starts.
    hold_compiling_grammars: a prefilled request whose grammar still compiles waits
    outside the batch (the other rows keep sampling) instead of its first sample waiting
    for the compilation. Its tokens are the same bits either way; the step it joins at
    (``EngineResult.steps``, ``finish_step``) then depends on the compilation's timing.
    """

    max_batch_size: int | None = None
    default_max_new_tokens: int = 16
    prefill_chunk: int | None = None
    eos_token_ids: tuple[int, ...] = (EOS_ID,)
    extra_logprobs_modes: tuple[str, ...] = ()
    vocab: Any = None
    think_end_token_id: int | None = None
    hold_compiling_grammars: bool = False

    def __post_init__(self) -> None:
        mb = self.max_batch_size
        if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or mb < 1):
            raise InvalidSamplingParams(f"max_batch_size must be None or >= 1, got {mb!r}")
        pc = self.prefill_chunk
        if pc is not None and (isinstance(pc, bool) or not isinstance(pc, int) or pc < 1):
            raise InvalidSamplingParams(f"prefill_chunk must be None or >= 1, got {pc!r}")
        n = self.default_max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidSamplingParams(f"default_max_new_tokens must be >= 1, got {n!r}")
        eos = tuple(self.eos_token_ids)
        for e in eos:
            if isinstance(e, bool) or not isinstance(e, int) or e < 0:
                raise InvalidSamplingParams(f"eos_token_ids must hold non-negative token ids, got {e!r}")
        object.__setattr__(self, "eos_token_ids", eos)
        modes = tuple(self.extra_logprobs_modes)
        for m in modes:
            if m not in LOGPROBS_MODES:
                raise InvalidSamplingParams(f"extra_logprobs_modes must hold modes of {LOGPROBS_MODES}, got {m!r}")
        object.__setattr__(self, "extra_logprobs_modes", modes)
        if not isinstance(self.hold_compiling_grammars, bool):
            raise InvalidSamplingParams(f"hold_compiling_grammars must be a bool, got {self.hold_compiling_grammars!r}")
        t = self.think_end_token_id
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 0):
            raise InvalidSamplingParams(f"think_end_token_id must be None or a token id, got {t!r}")


@dataclass(frozen=True)
class RequestResult:
    """What the engine reports for one request.

    token_ids: generated ids (the stopping token included). logprobs: mode -> float32
    ``[len(token_ids)]`` sampling-time logprobs (the request's own mode and every extra
    mode). top_logprobs: ``([n, k] float32, [n, k] int64)`` when ``params.logprobs = k > 0``.
    """

    rid: str
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: dict[str, torch.Tensor]
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None
    seed: int
    finish_reason: str
    arrival_step: int
    finish_step: int


@dataclass
class EngineResult:
    """Per-request results (by rid) and the batch composition of every step (rids by row)."""

    results: dict[str, RequestResult]
    steps: list[tuple[str, ...]] = field(default_factory=list)
    speculative: SpecStats | None = None  # drafted / accepted counts of a speculative run

    def __getitem__(self, rid: str) -> RequestResult:
        return self.results[rid]


@dataclass
class _Row:
    arrival: Arrival
    cache: KVCache
    max_new: int
    feed: list[int] = field(default_factory=list)  # prompt tokens not yet prefilled
    tokens: list[int] = field(default_factory=list)
    logprobs: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    top: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    compiling: SamplingBatch | None = None  # built at admission: its grammar compiles
    held: torch.Tensor | None = None  # logits of the last prompt token while held
    stop_after: Any = None  # generated ids -> True when they end the request (stop strings)


@dataclass
class _State:
    """Scheduler state of one run: rows are aligned with ``batch`` (and ``extra``)."""

    pending: deque
    waiting: deque = field(default_factory=deque)
    filling: list[_Row] = field(default_factory=list)
    rows: list[_Row] = field(default_factory=list)
    held: list[_Row] = field(default_factory=list)  # prefilled, grammar still compiling
    batch: SamplingBatch | None = None
    extra: dict[str, SamplingBatch] = field(default_factory=dict)
    on_finish: Any = None  # RequestResult -> None, called as each request finishes
    stop_after: Any = None  # (Request, generated ids) -> bool: Engine.run's stop test


def _bound(stop_after: Any, request: Request) -> Any:
    """``stop_after`` bound to one request (None without a stop test)."""
    if stop_after is None:
        return None
    return lambda ids: bool(stop_after(request, ids))


class Engine:
    """Runs a :class:`Schedule` against a causal LM adapter (module docstring) with a
    :class:`Sampler`."""

    def __init__(
        self,
        model: Any,
        sampler: Sampler | None = None,
        config: EngineConfig | None = None,
        speculative: Speculative | None = None,
    ) -> None:
        self.model = model
        self.sampler = sampler if sampler is not None else Sampler()
        self.config = config if config is not None else EngineConfig()
        self._vocab = self.config.vocab
        if speculative is not None:
            if not isinstance(speculative, Speculative):
                raise InvalidSamplingParams(f"speculative must be a Speculative, got {type(speculative).__name__}")
            check_truncatable(model, "model")
        self.speculative = speculative

    @property
    def vocab(self) -> Any:
        """The grammar vocabulary (built once per engine, so its compile cache is reused)."""
        if self._vocab is None:
            self._vocab = default_vocab(self.model)
        return self._vocab

    def _batch(self, requests: Sequence[Request], mode: str | None = None) -> SamplingBatch:
        if mode is not None:
            requests = [Request(r.rid, with_mode(r.params, mode), r.prompt_ids, r.output_ids) for r in requests]
        return SamplingBatch.from_requests(
            requests,
            vocab_size=self.model.vocab_size,
            eos_token_ids=self.config.eos_token_ids,
            vocab=self.vocab,
            think_end_token_id=self.config.think_end_token_id,
        )

    def _check(self, schedule: Schedule) -> None:
        if not isinstance(schedule, Schedule):
            raise InvalidSamplingParams(f"schedule must be a Schedule, got {type(schedule).__name__}")
        V, S = self.model.vocab_size, self.model.max_seq_len
        for a in schedule.arrivals:
            r = a.request
            check_request(r, V)  # every rule of a batch build
            self.sampler.validate_request(r)  # the registered processors' validate_params
            if r.params.grammar is not None and self.vocab is None:
                raise InvalidSamplingParams(
                    f"request {r.rid!r}: {r.params.grammar[0]} needs a vocabulary; the "
                    f"model has vocab_size={V}, so pass EngineConfig(vocab=...)"
                )
            n = len(r.prompt_ids) + len(r.output_ids)
            if S is not None and n >= S:
                raise InvalidSamplingParams(
                    f"request {r.rid!r}: prompt_ids + output_ids has {n} tokens, the model's "
                    f"max_seq_len={S} leaves no room to generate"
                )

    def run(self, schedule: Schedule, on_finish: Any = None, stop_after: Any = None) -> EngineResult:
        """Run every request of ``schedule`` to completion; ``on_finish(result)`` (a
        :class:`RequestResult`) is called as each request finishes (progress).
        ``stop_after(request, token_ids)`` (optional) is asked after each recorded token
        with the request's generated ids so far; True ends the request there with reason
        ``"stop"``, that token kept (stop strings: the rollout's decoded-text test). A
        speculative step's accepted tokens are asked one by one, so the request ends at
        the same token either way."""
        self._check(schedule)
        cfg = self.config
        st = _State(pending=deque(schedule.ordered()), on_finish=on_finish, stop_after=stop_after)
        out = EngineResult(results={})
        if self.speculative is not None:
            out.speculative = SpecStats()
        step = 0
        while st.pending or st.waiting or st.rows or st.filling or st.held:
            if not (st.rows or st.filling or st.waiting or st.held) and st.pending[0].step > step:
                step = st.pending[0].step  # idle until the next arrival
            while st.pending and st.pending[0].step <= step:
                st.waiting.append(st.pending.popleft())
            busy = len(st.rows) + len(st.filling) + len(st.held)
            room = (
                len(st.waiting)
                if cfg.max_batch_size is None
                else max(0, min(len(st.waiting), cfg.max_batch_size - busy))
            )
            for _ in range(room):
                a = st.waiting.popleft()
                q = a.request
                st.filling.append(
                    _Row(
                        a,
                        self.model.new_cache(),
                        q.params.max_new_tokens or cfg.default_max_new_tokens,
                        feed=list(q.prompt_ids) + list(q.output_ids),
                        compiling=self._batch([q]) if q.params.grammar else None,
                        stop_after=_bound(st.stop_after, q),
                    )
                )
            drafts = self._propose(st, out.speculative) if out.speculative else []
            outs = self._forward(st, drafts)
            if st.rows:
                out.steps.append(tuple(r.arrival.request.rid for r in st.rows))
                if out.speculative is not None:
                    drafts += [[] for _ in range(len(st.rows) - len(drafts))]  # joined rows
                    self._verify(st, outs, drafts, out, step)
                else:
                    self._sample(st, torch.stack([o[-1] for o in outs]), out, step)
            step += 1
        return out

    def _forward(self, st: _State, drafts: Sequence[Sequence[int]] = ()) -> list[torch.Tensor]:
        """One ragged model call: every sampling row feeds its last token (and its drafts),
        every filling row its next prefill chunk. Rows whose prefill completes join the
        batch. Returns per row of ``st.rows`` the logits ``[1 + drafts, V]`` of its last
        input token and its drafts (a joined row: of its last prompt token)."""
        chunk = self.config.prefill_chunk
        caches = [r.cache for r in st.rows] + [r.cache for r in st.filling]
        feeds = [[r.tokens[-1]] + list(d) for r, d in zip(st.rows, drafts)]
        feeds += [[r.tokens[-1]] for r in st.rows[len(feeds) :]]
        for r in st.filling:
            n = len(r.feed) if chunk is None else min(chunk, len(r.feed))
            feeds.append(r.feed[:n])
            r.feed = r.feed[n:]
        outs = self.model.forward(caches, feeds) if caches else []
        n_rows = len(st.rows)
        last = [o if i < n_rows else o[-1:] for i, o in enumerate(outs)]
        for i, r in enumerate(st.filling):
            if not r.feed:
                r.held = last[n_rows + i]
                st.held.append(r)
        st.filling = [r for r in st.filling if r.feed]
        return last[:n_rows] + self._join(st)

    def _join(self, st: _State) -> list[torch.Tensor]:
        """Prefilled rows join the batch, except those whose grammar is still compiling:
        they are held out (their last logits kept) and join at a later step, so no sample
        waits for a compilation while other rows have work; when no other row has (none
        running, filling or joining) they join at once and the sample waits as it must. A row's
        tokens do not depend on the step it joins at. Returns the joined rows' logits."""
        new = [
            r
            for r in st.held
            if r.compiling is None or all(r.compiling.grammar_ready()) or not self.config.hold_compiling_grammars
        ]
        if not (new or st.rows or st.filling):
            new = list(st.held)  # nothing else to run
        if not new:
            return []
        st.held = [r for r in st.held if all(r is not n for n in new)]
        reqs = [r.arrival.request for r in new]
        if st.batch is None:
            st.batch = self._batch(reqs)
            st.extra = {m: self._batch(reqs, m) for m in self.config.extra_logprobs_modes}
        else:
            st.batch.merge(self._batch(reqs))
            for m, b in st.extra.items():
                b.merge(self._batch(reqs, m))
        st.rows.extend(new)
        held = [r.held for r in new]
        for r in new:
            r.held, r.compiling = None, None
        return held

    def _sample(self, st: _State, logits: torch.Tensor, out: EngineResult, step: int) -> None:
        """Sample every row, record tokens and logprobs, drop finished rows."""
        batch, rows = st.batch, st.rows
        assert batch is not None and len(batch) == len(rows) == logits.shape[0]
        positions = torch.tensor([len(r.cache) - 1 for r in rows], dtype=torch.int64)
        s, extra_lp = self._draw(st, logits, positions)
        reasons = [self._record(row, i, s, extra_lp, batch, len(row.cache)) for i, row in enumerate(rows)]
        self._finish(st, reasons, out, step)

    def _propose(self, st: _State, stats: SpecStats) -> list[list[int]]:
        """Drafts of every running row, at most k and what its limits leave room for."""
        if not st.rows:
            return []
        k, S = self.speculative.num_speculative_tokens, self.model.max_seq_len
        rows = []
        for r in st.rows:
            q = r.arrival.request
            room = min(k, r.max_new - len(r.tokens) - 1)
            if S is not None:
                room = min(room, S - len(r.cache) - 1)
            seq = tuple(q.prompt_ids) + tuple(q.output_ids) + tuple(r.tokens)
            rows.append(DraftRow(q, seq, tuple(r.tokens), max(0, room)))
        drafts = check_drafts(self.speculative.proposer.propose(rows), rows, self.model.vocab_size)
        stats.proposed += sum(len(d) for d in drafts)
        return drafts

    def _verify(
        self, st: _State, outs: list[torch.Tensor], drafts: list[list[int]], out: EngineResult, step: int
    ) -> None:
        """Draw every drafted position of every row in order; keep a row's draws while
        they confirm its drafts (the first one that does not is kept in their place);
        roll the batches back over the rest and truncate the caches to what was kept."""
        rows, stats = st.rows, out.speculative
        base = [len(r.cache) - len(d) for r, d in zip(rows, drafts)]  # plain run's cache
        alive, kept = [True] * len(rows), [0] * len(rows)
        reasons: list[str | None] = [None] * len(rows)
        n = 0
        while any(alive):
            j = n
            logits = torch.stack([o[min(j, o.shape[0] - 1)] for o in outs])
            positions = torch.tensor([b - 1 + min(j, len(d)) for b, d in zip(base, drafts)], dtype=torch.int64)
            s, extra_lp = self._draw(st, logits, positions)
            n += 1
            for i in (i for i in range(len(rows)) if alive[i]):
                kept[i] += 1
                reasons[i] = self._record(rows[i], i, s, extra_lp, st.batch, base[i] + j)
                hit = j < len(drafts[i]) and int(s.token_ids[i]) == drafts[i][j]
                stats.accepted += int(hit)
                alive[i] = reasons[i] is None and hit
        back = [n - m for m in kept]
        for b in (st.batch, *st.extra.values()):
            b.rollback(back)
        for r, b, m in zip(rows, base, kept):
            r.cache.truncate(b - 1 + m)
        stats.steps += 1
        stats.emitted += sum(kept)
        self._finish(st, reasons, out, step)

    def _draw(self, st: _State, logits: torch.Tensor, positions: torch.Tensor) -> tuple:
        """Sample every row at ``positions``, score the extra modes, advance the batches."""
        s = self.sampler.sample(logits, st.batch, positions)
        safe = s.token_ids.clamp(min=0)
        extra_lp = {m: self.sampler.compute_logprobs(logits, b, safe) for m, b in st.extra.items()}
        st.batch.advance(s.token_ids)
        for b in st.extra.values():
            b.advance(s.token_ids)
        return s, extra_lp

    def _finish(self, st: _State, reasons: Sequence[str | None], out: EngineResult, step: int) -> None:
        """Record the results of rows with a finish reason; filter them out."""
        rows, batch = st.rows, st.batch
        keep = []
        for i, (row, reason) in enumerate(zip(rows, reasons)):
            if reason is None:
                keep.append(i)
            else:
                res = out.results[row.arrival.request.rid] = self._result(row, reason, step)
                if st.on_finish is not None:
                    st.on_finish(res)
        if len(keep) != len(rows):
            batch.filter(keep)
            for b in st.extra.values():
                b.filter(keep)
            st.rows = [rows[i] for i in keep]

    def _record(
        self, row: _Row, i: int, s: Any, extra_lp: dict[str, torch.Tensor], batch: SamplingBatch, held: int
    ) -> str | None:
        """Store row i's sampled token; return its finish reason or None to continue.
        ``held``: tokens the row's cache holds in the plain run at this draw."""
        t = int(s.token_ids[i])
        p: SamplingParams = row.arrival.request.params
        if t < 0:
            return batch.finished[i] or "no_valid_token"
        row.tokens.append(t)
        row.logprobs.setdefault(p.logprobs_mode, []).append(s.logprobs[i])
        for m, lp in extra_lp.items():
            if m != p.logprobs_mode:  # the request's own mode is recorded above
                row.logprobs.setdefault(m, []).append(lp[i])
        if p.logprobs > 0 and s.top_logprobs is not None:
            row.top.append((s.top_logprobs[0][i, : p.logprobs], s.top_logprobs[1][i, : p.logprobs]))
        if batch.finished[i] is not None:
            return batch.finished[i]
        if t in self.config.eos_token_ids:
            return FINISH_EOS
        if t in p.stop_token_ids:
            return FINISH_STOP
        if row.stop_after is not None and row.stop_after(row.tokens):
            return FINISH_STOP
        if len(row.tokens) >= row.max_new:
            return FINISH_LENGTH
        limit = self.model.max_seq_len
        if limit is not None and held + 1 > limit:
            return FINISH_MAX_SEQ_LEN
        return None

    @staticmethod
    def _result(row: _Row, reason: str, step: int) -> RequestResult:
        r = row.arrival.request
        lps = {m: torch.stack(v) if v else torch.empty(0, dtype=torch.float32) for m, v in row.logprobs.items()}
        if not lps:
            lps = {r.params.logprobs_mode: torch.empty(0, dtype=torch.float32)}
        top = None
        if r.params.logprobs > 0:
            k = r.params.logprobs
            top = (
                torch.stack([v for v, _ in row.top]) if row.top else torch.empty((0, k)),
                torch.stack([ids for _, ids in row.top]) if row.top else torch.empty((0, k), dtype=torch.int64),
            )
        return RequestResult(
            rid=r.rid,
            prompt_ids=tuple(r.prompt_ids),
            token_ids=tuple(row.tokens),
            logprobs=lps,
            top_logprobs=top,
            seed=int(r.params.seed),
            finish_reason=reason,
            arrival_step=row.arrival.step,
            finish_step=step,
        )


def default_vocab(model: Any) -> Any:
    """``Vocabulary.default()`` when the model has its 512-token layout, else None."""
    from detsample.vocab import DEFAULT_VOCAB_SIZE, Vocabulary

    return Vocabulary.default() if model.vocab_size == DEFAULT_VOCAB_SIZE else None


def with_mode(params: SamplingParams, mode: str) -> SamplingParams:
    """``params`` (same seed) reporting logprobs in ``mode``, without top logprobs."""
    return params.replace(logprobs_mode=mode, logprobs=0)


def rescore(
    model: Any,
    sampler: Sampler,
    request_params: SamplingParams,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    *,
    eos_token_ids: Sequence[int] = (EOS_ID,),
    vocab: Any = None,
    think_end_token_id: int | None = None,
) -> torch.Tensor:
    """Logprobs of ``output_ids`` after ``prompt_ids`` by ONE prefill (the trainer's path).

    Row i of the rescoring batch is the request with ``output_ids[:i]`` already generated
    (penalty / min_new_tokens / grammar state replayed), scored with
    ``Sampler.compute_logprobs`` on the prefill logits of position ``len(prompt) + i - 1``.
    Returns float32 ``[len(output_ids)]`` in ``request_params.logprobs_mode``. ``vocab``
    (grammars) defaults to :func:`default_vocab` for a request with a grammar;
    ``think_end_token_id`` is the engine's (``require_reasoning``).
    """
    prompt, output = list(prompt_ids), list(output_ids)
    if not prompt:
        raise InvalidSamplingParams("rescore: prompt_ids must not be empty, got []")
    if not output:
        return torch.empty(0, dtype=torch.float32)
    full = model.forward([model.new_cache()], [prompt + output])[0]
    logits = full[len(prompt) - 1 : len(prompt) + len(output) - 1]
    return score_logits(
        model,
        sampler,
        request_params,
        prompt,
        output,
        logits,
        eos_token_ids=eos_token_ids,
        vocab=vocab,
        think_end_token_id=think_end_token_id,
    )


def score_logits(
    model: Any,
    sampler: Sampler,
    request_params: SamplingParams,
    prompt: list[int],
    output: list[int],
    logits: torch.Tensor,
    *,
    eos_token_ids: Sequence[int] = (EOS_ID,),
    vocab: Any = None,
    think_end_token_id: int | None = None,
) -> torch.Tensor:
    """:func:`rescore` after its prefill: ``logits`` [len(output), V] are the rows that
    score ``output`` (row i: after ``prompt + output[:i]``); float32 [len(output)]."""
    reqs = [Request(f"rescore/{i}", request_params, prompt, output[:i]) for i in range(len(output))]
    if vocab is None and request_params.grammar is not None:
        vocab = default_vocab(model)
    batch = SamplingBatch.from_requests(
        reqs,
        vocab_size=model.vocab_size,
        eos_token_ids=tuple(eos_token_ids),
        vocab=vocab,
        think_end_token_id=think_end_token_id,
    )
    return sampler.compute_logprobs(logits.contiguous(), batch, torch.tensor(output, dtype=torch.int64))
