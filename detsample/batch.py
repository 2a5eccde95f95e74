"""Row-aligned batch state: the analogue of SGLang's ``SamplingBatchInfo``.

``SamplingBatch.from_requests`` turns per-request scalars into row-aligned tensors in
one pass. Every row-aligned tensor and every per-row host list follows the rows
through :meth:`filter` (any order, so it can permute) and :meth:`merge`. What is derived
from the rows (:meth:`derived`: the sampler's row plan, ``is_all_greedy``, ...) is
rebuilt after each change; **a derived summary may make the sampler skip work but never
changes any row's result** (each op is row-local).

Tensors (B rows, V vocabulary):

===================  =================  ==============================================
``temperatures``     (B, 1) float32     0 for greedy rows
``top_ks``           (B,) int32         ``min(top_k, V)``; ``V`` when disabled
``top_ps``           (B,) float64       1.0 when disabled (float64: the exact user value)
``element_filters``  (B, F) float32     the element-wise filters' parameters, column j
                                        of ``rules.ELEMENT_FILTERS[j]`` (its neutral
                                        value when disabled)
``seeds``            (B,) int64         resolved seeds (never shared defaults)
``greedy``           (B,) bool          temperature 0 or top_k 1
===================  =================  ==============================================

``batch.<name>s`` is the (B,) float32 column of the element-wise filter ``<name>`` (a
view of ``element_filters``; min-p's is ``batch.<name>s`` with its field's name).

logit bias is sparse: ``logit_bias_coo()`` returns ``(rows, cols, values)`` with no
duplicate (row, col) pair (keys are deduplicated by integer value in SamplingParams), and
no ``(B, V)`` tensor exists for it.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch

from detsample import rules
from detsample.grammar import batching as grammar_hooks  # grammar rows
from detsample.ops.bias import BiasCOO, bias_coo
from detsample.ops.host import to_device
from detsample.params import Request, SamplingParams
from detsample.params.validation import check_request, fail, id_sequence, int_list
from detsample.processors import penalties as constraints  # penalties, constraints
from detsample.processors.batch_update import BatchUpdate, diff_update  # processors
from detsample.processors.penalty_state import PenaltyState

FINISH_NO_VALID_TOKEN = "no_valid_token"


class SamplingBatch:
    """Per-row sampling state of a batch; see the module docstring for the tensors."""

    def __init__(self, *, vocab_size: int, device: torch.device, eos_token_ids: tuple[int, ...], vocab: Any) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.eos_token_ids = eos_token_ids
        self.vocab = vocab
        self.think_end_token_id: int | None = None  # require_reasoning's end of thinking
        self.requests: list[Request] = []
        self.output_ids: list[list[int]] = []
        self.finished: list[str | None] = []
        self.grammars: list = []  # RequestGrammar | None per row
        self.temperatures = torch.empty((0, 1), dtype=torch.float32, device=device)
        self.top_ks = torch.empty((0,), dtype=torch.int32, device=device)
        self.top_ps = torch.empty((0,), dtype=torch.float64, device=device)
        self.element_filters = torch.empty((0, len(rules.ELEMENT_FILTERS)), dtype=torch.float32, device=device)
        self.seeds = torch.empty((0,), dtype=torch.int64, device=device)
        self.greedy = torch.empty((0,), dtype=torch.bool, device=device)
        self._coo: BiasCOO | tuple[()] | None = None  # () = built, no bias
        self._derived: dict[Any, Any] = {}
        # -- penalty counts (None unless a row has a penalty), step-3 row
        # cache, and stable row identities from which processors' BatchUpdates derive.
        self.penalties: PenaltyState | None = None
        self._constraints: constraints.ConstraintRows | None = None
        self.row_uids: list[int] = []
        self._next_uid = 0
        # min_new_tokens' EOS ids per row: a row keeps those of the batch it was built in
        # (eos_token_ids of from_requests), whatever batch it is merged into.
        self.row_eos: list[tuple[int, ...]] = []
        # per row, one entry per advance: (token, grammar tokens fed, finished before);
        # what rollback undoes (speculative decoding rejects drafted tokens with it)
        self.journal: list[list[tuple[int, int, str | None]]] = []

    # -- construction ----------------------------------------------------------------
    @classmethod
    def from_requests(
        cls,
        requests: Sequence[Request],
        vocab_size: int,
        device: str | torch.device = "cpu",
        eos_token_ids: Sequence[int] = (0,),
        vocab: Any = None,
        think_end_token_id: int | None = None,
    ) -> SamplingBatch:
        """Build the row-aligned state of ``requests`` (row i = requests[i]).

        ``think_end_token_id``: the end-of-thinking token after which the grammar of a
        ``require_reasoning`` request starts (such a request with a grammar needs it).

        Raises InvalidSamplingParams for a token id outside ``[0, vocab_size)`` in any
        request field, naming the request, the field and the id.
        """
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral) or vocab_size < 1:
            fail(f"vocab_size must be a positive integer, got {vocab_size!r}")
        vocab_size = int(vocab_size)
        # the device tensors actually report ("cuda" -> cuda:0, "cpu:0" -> cpu), so
        # that logits made on it compare equal in Sampler's device check and in merge
        dev = torch.empty(0, device=device).device
        eos = id_sequence("eos_token_ids", eos_token_ids)  # None: no EOS ids
        for e in eos:
            if not 0 <= e < vocab_size:
                fail(f"eos_token_ids contains {e}, outside the vocabulary [0, {vocab_size})")
        if vocab is not None and getattr(vocab, "vocab_size", vocab_size) > vocab_size:
            fail(f"vocab has {vocab.vocab_size} tokens, more than vocab_size={vocab_size}")
        if think_end_token_id is not None:
            think = int_list("think_end_token_id", [think_end_token_id])[0]
            if not 0 <= think < vocab_size:
                fail(f"think_end_token_id must be in [0, {vocab_size}), got {think}")
        batch = cls(vocab_size=vocab_size, device=dev, eos_token_ids=eos, vocab=vocab)
        batch.think_end_token_id = think_end_token_id
        reqs = list(requests)
        for r in reqs:
            if not isinstance(r, Request):
                fail(f"requests must be Request objects, got {type(r).__name__}")
            check_request(r, vocab_size)
        batch._append_rows(reqs)
        return batch

    def _row_tensors(self, params: list[SamplingParams]) -> dict[str, torch.Tensor]:
        V = self.vocab_size
        temps = torch.tensor([[0.0 if p.is_greedy else p.temperature] for p in params], dtype=torch.float32).reshape(
            -1, 1
        )
        top_ks = torch.tensor([V if p.top_k == -1 else min(p.top_k, V) for p in params], dtype=torch.int32)
        host = {
            "temperatures": temps,
            "top_ks": top_ks,
            "top_ps": torch.tensor([p.top_p for p in params], dtype=torch.float64),
            "element_filters": torch.tensor([rules.element_values(p) for p in params], dtype=torch.float32).reshape(
                -1, len(rules.ELEMENT_FILTERS)
            ),
            "seeds": torch.tensor([p.seed for p in params], dtype=torch.int64),
            "greedy": torch.tensor([p.is_greedy for p in params], dtype=torch.bool),
        }
        return {k: to_device(v, self.device) for k, v in host.items()}

    _ROW_TENSORS = ("temperatures", "top_ks", "top_ps", "element_filters", "seeds", "greedy")

    def __getattr__(self, name: str) -> torch.Tensor:
        """``<filter>s``: the (B,) float32 column of ``element_filters`` of the element-wise
        filter ``<filter>`` (a view). Called only for names that are not attributes."""
        ef = self.__dict__.get("element_filters")
        if ef is not None and name.endswith("s"):
            for j, f in enumerate(rules.ELEMENT_FILTERS):
                if f.name == name[:-1]:
                    return ef[:, j]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _append_rows(self, reqs: list[Request]) -> None:
        grammars = grammar_hooks.build_row_grammars(  # may raise
            reqs, self.vocab, self.think_end_token_id
        )
        new = self._row_tensors([r.params for r in reqs])
        for name in self._ROW_TENSORS:
            setattr(self, name, torch.cat([getattr(self, name), new[name]], dim=0))
        n_before = len(self.requests)
        self.requests.extend(reqs)
        self.output_ids.extend(list(r.output_ids) for r in reqs)
        self.finished.extend(None for _ in reqs)
        self.row_eos.extend(self.eos_token_ids for _ in reqs)
        self.journal.extend([] for _ in reqs)
        self.penalties = PenaltyState.extend(self.penalties, n_before, reqs, self.output_ids[n_before:])
        self._new_uids(len(reqs))
        self.grammars.extend(grammars)
        self._changed()

    # -- processor and penalty hooks ---------------------------------------------------------------
    def _new_uids(self, n: int) -> None:
        self.row_uids.extend(range(self._next_uid, self._next_uid + n))
        self._next_uid += n

    def update_since(self, old_uids: Sequence[int]) -> BatchUpdate | None:
        """The processors' BatchUpdate from the row identities ``old_uids`` (a view of
        this batch taken earlier) to the current rows; None when nothing changed."""
        return diff_update(
            old_uids,
            self.row_uids,
            lambda j: (self.requests[j].params, self.requests[j].prompt_ids, self.output_ids[j]),
        )

    def constraint_rows(self) -> constraints.ConstraintRows:
        """Rows with min_new_tokens / allowed_token_ids / bad_words (cached)."""
        if self._constraints is None:
            self._constraints = constraints.constraint_rows(self)
        return self._constraints

    def derived(self, key: Any, build: Callable[[], Any]) -> Any:
        """``build()``, a value derived from the rows' parameters (a Sampler's row plan),
        cached under ``key`` until the next ``filter`` / ``merge``."""
        v = self._derived.get(key)
        if v is None:
            v = self._derived[key] = build()
        return v

    def _changed(self) -> None:
        self._coo = None
        self._constraints = None
        self._derived.clear()

    # -- batch composition -----------------------------------------------------------
    def __len__(self) -> int:
        return len(self.requests)

    def filter(self, keep: Sequence[int]) -> BatchUpdate | None:
        """Keep rows ``keep`` in this order (in place); any order, so it can permute.

        Returns the processors' BatchUpdate of this change (removed, then moved), None
        when nothing changed. Raises InvalidSamplingParams for an index out of range or
        repeated.
        """
        idx = int_list("filter indices", keep)
        B = len(self)
        for i in idx:
            if not 0 <= i < B:
                fail(f"filter index {i} out of range for a batch of {B} rows")
        if len(set(idx)) != len(idx):
            fail(f"filter indices must be distinct, got {idx}")
        if idx == list(range(B)):
            return None
        old_uids = self.row_uids
        self.row_uids = [old_uids[i] for i in idx]
        self.penalties = PenaltyState.filter(self.penalties, idx)
        sel = torch.tensor(idx, dtype=torch.int64, device=self.device)
        for name in self._ROW_TENSORS:
            setattr(self, name, getattr(self, name).index_select(0, sel))
        self.requests = [self.requests[i] for i in idx]
        self.output_ids = [self.output_ids[i] for i in idx]
        self.finished = [self.finished[i] for i in idx]
        self.row_eos = [self.row_eos[i] for i in idx]
        self.journal = [self.journal[i] for i in idx]
        self.grammars = [self.grammars[i] for i in idx]
        self._changed()
        return self.update_since(old_uids)

    def merge(self, other: SamplingBatch) -> BatchUpdate | None:
        """Append ``other``'s rows after this batch's rows (in place).

        Returns the processors' BatchUpdate (``added`` only), None if ``other`` is empty.
        """
        if not isinstance(other, SamplingBatch):
            fail(f"merge expects a SamplingBatch, got {type(other).__name__}")
        if other.vocab_size != self.vocab_size:
            fail(f"merge: vocab_size differs ({self.vocab_size} vs {other.vocab_size})")
        if other.device != self.device:
            fail(f"merge: device differs ({self.device} vs {other.device})")
        if other is self:
            fail("merge: a batch cannot be merged with itself")
        vocab = grammar_hooks.merged_vocab(self, other)  # checked before any change
        grammars = [
            g.fork() if g is not None else None  # never shared
            for g in other.grammars
        ]
        for name in self._ROW_TENSORS:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)], 0))
        old_uids = list(self.row_uids)
        self.penalties = PenaltyState.merge(self.penalties, len(self), other.penalties, len(other))
        self._new_uids(len(other))
        self.requests.extend(other.requests)
        self.output_ids.extend(list(o) for o in other.output_ids)
        self.finished.extend(other.finished)
        self.row_eos.extend(other.row_eos)
        self.journal.extend(list(j) for j in other.journal)
        self.vocab = vocab
        self.grammars.extend(grammars)
        self._changed()
        return self.update_since(old_uids)

    def advance(self, token_ids: torch.Tensor | Sequence[int]) -> None:
        """Record each row's sampled token (penalty counts, min_new_tokens, grammar).

        token_ids: (B,) int. A token of -1 (the sampler's "no admissible token") is not
        recorded; the row is marked finished with reason ``"no_valid_token"``.
        """
        toks = int_list("advance: token_ids", token_ids)
        if len(toks) != len(self):
            fail(f"advance: token_ids has {len(toks)} entries for a batch of {len(self)} rows")
        for i, t in enumerate(toks):  # validate all first: a bad id changes no row
            if t != -1 and not 0 <= t < self.vocab_size:
                fail(f"advance: row {i} token id {t} outside the vocabulary [0, {self.vocab_size})")
        before = list(self.finished)
        fed = grammar_hooks.grammar_lengths(self) if self.has_grammars else None
        for i, t in enumerate(toks):
            if t == -1:
                self.finished[i] = FINISH_NO_VALID_TOKEN
                continue
            self.output_ids[i].append(t)
        if self.penalties is not None:
            self.penalties.advance(toks)
        try:
            grammar_hooks.advance_grammars(self, toks)  # after every row is recorded
        finally:
            after = grammar_hooks.grammar_lengths(self) if fed is not None else None
            for i, t in enumerate(toks):
                n = 0 if fed is None else after[i] - fed[i]
                self.journal[i].append((t, n, before[i]))

    def rollback(self, steps: Sequence[int]) -> None:
        """Undo the last ``steps[i]`` :meth:`advance` calls of row i (in place): its output
        ids, penalty counts, grammar matcher and finish state are those before them.

        Speculative decoding advances every row by each drafted position and rolls back
        what the target rejected. Raises InvalidSamplingParams for a count that is not an
        integer in ``[0, advances recorded since the row joined this batch]``.
        """
        counts = int_list("rollback: steps", steps)
        if len(counts) != len(self):
            fail(f"rollback: steps has {len(counts)} entries for a batch of {len(self)} rows")
        for i, k in enumerate(counts):
            if not 0 <= k <= len(self.journal[i]):
                fail(f"rollback: row {i} steps must be in [0, {len(self.journal[i])}], got {k}")
        removed, fed = [], []
        for i, k in enumerate(counts):
            undone = self.journal[i][len(self.journal[i]) - k :][::-1]  # latest first
            del self.journal[i][len(self.journal[i]) - k :]
            toks = [t for t, _, _ in undone if t != -1]
            if toks:
                del self.output_ids[i][-len(toks) :]
            if undone:
                self.finished[i] = undone[-1][2]
            removed.append(toks)
            fed.append(sum(n for _, n, _ in undone))
        if self.penalties is not None:
            self.penalties.rollback(removed)
        grammar_hooks.rollback_grammars(self, fed)

    # -- derived views ---------------------------------------------------------------
    @property
    def params(self) -> tuple[SamplingParams, ...]:
        """The rows' parameters in row order (derived once per composition)."""
        return self.derived("params", lambda: tuple(r.params for r in self.requests))

    @property
    def has_grammars(self) -> bool:
        """Whether any row carries a grammar (derived once per composition)."""
        return self.derived("has_grammars", lambda: any(g is not None for g in self.grammars))

    def grammar_ready(self) -> list[bool]:
        """Per row: False while its grammar is still compiling (sampling the row now would
        wait for it), True otherwise (no grammar, compiled, or failed). Never waits."""
        return [g is None or g.dormant or g.ready for g in self.grammars]

    @property
    def is_all_greedy(self) -> bool:
        """Whether every row is greedy (derived once per composition)."""
        return self.derived("is_all_greedy", lambda: all(p.is_greedy for p in self.params))

    def logit_bias_coo(self) -> BiasCOO | None:
        """Sparse logit bias as (rows int64, cols int64, values float32), or None; built
        on the batch's device once per composition change."""
        if self._coo is None:
            self._coo = bias_coo([p.logit_bias for p in self.params], self.device) or ()
        return self._coo or None

    def rows_with_mode(self, mode: str) -> list[int]:
        return [i for i, p in enumerate(self.params) if p.logprobs_mode == mode]
