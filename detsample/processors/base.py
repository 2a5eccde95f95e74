"""Logits processors (pipeline step 1), on the vLLM v1 model.

Two kinds, both seeing the model's logits before any other step:

* **batch-level** :class:`LogitsProcessor` objects, registered with
  ``Sampler(processors=(...))``, run in registration order over the whole batch. They
  keep per-row state, kept in step with the batch by :class:`BatchUpdate` objects
  (removed, added, moved; see :mod:`detsample.processors.batch_update`) that the Sampler delivers
  before every ``apply`` (``update_state(None)`` when nothing changed).
  ``is_argmax_invariant()`` processors are skipped when every row is greedy; when they
  do run, the Sampler restores the greedy rows afterwards, so whether they ran can
  never change a row's result (batch-composition invariance).
* **per-request** processors (SGLang's custom logit processor): ``params.logits_processor``,
  a callable ``proc(logits_rows, rows) -> logits_rows`` where ``logits_rows`` is the
  (n, V) float32 sub-batch of the rows carrying that very object (grouped by identity,
  in batch order, so it runs once per step however many rows share it) and ``rows`` the
  matching :class:`RowInfo` list. Per-request processors run after the batch-level ones.

A processor must compute each row from that row's logits and state alone; the Sampler
cannot check this, and a processor that mixes rows breaks batch invariance.
"""

from __future__ import annotations

import abc
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from detsample.errors import InvalidSamplingParams
from detsample.ops.host import host_tensor
from detsample.params import SamplingParams
from detsample.processors.batch_update import AddedRequest, BatchUpdate, BatchView, MoveDirectionality, apply_to_slots  # noqa: F401 (re-export)


class LogitsProcessor(abc.ABC):
    """A batch-level logits processor (vLLM v1 interface)."""

    def validate_params(self, params: SamplingParams) -> None:  # noqa: B027 - optional hook
        """Raise InvalidSamplingParams (naming the field) for a request this processor
        cannot serve. Called for every request before it is added. Default: accept."""

    @abc.abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True when ``apply`` never changes any row's argmax (e.g. min-p)."""

    @abc.abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Apply removed, then added, then moved (None: the rows did not change)."""

    @abc.abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: (B, V) float32, a copy the processor may modify in place.
        Returns (B, V) float32 (the same tensor or a new one)."""


class SlotProcessor(LogitsProcessor):
    """Helper base: keeps one entry per row (``self.slots``), built by ``make_entry``
    from each added row and moved/removed by the update; ``None`` entries are rows the
    processor ignores. Subclasses implement ``make_entry`` and ``apply``."""

    def __init__(self) -> None:
        self.slots: list[Any] = []
        self._version = 0  # bumped on every change, for subclass caches

    def make_entry(self, added: AddedRequest) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is not None:
            self.slots = apply_to_slots(self.slots, batch_update, self.make_entry)
            self._version += 1

    def rows_with_entries(self) -> list[int]:
        return [i for i, e in enumerate(self.slots) if e is not None]


@dataclass(frozen=True)
class RowInfo:
    """What a per-request processor learns about one of its rows."""

    rid: str
    params: SamplingParams
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]


def _check_out(name: str, out: Any, shape: tuple[int, int], dev: torch.device) -> None:
    if (
        not isinstance(out, torch.Tensor)
        or out.dtype != torch.float32
        or tuple(out.shape) != shape
        or out.device != dev
    ):
        got = f"{out.dtype} {tuple(out.shape)} on {out.device}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise InvalidSamplingParams(f"logits processor {name} must return float32 {shape} on {dev}, got {got}")


def _request_groups(batch: BatchView) -> tuple[tuple[Any, list[int], torch.Tensor], ...]:
    """``(processor, rows, row index tensor)`` per distinct per-request processor, in
    batch order (derived once per batch composition)."""
    groups: dict[int, tuple[Any, list[int]]] = {}
    for i, p in enumerate(batch.params):
        if p.logits_processor is not None:
            groups.setdefault(id(p.logits_processor), (p.logits_processor, []))[1].append(i)
    return tuple((proc, rows, host_tensor(rows, torch.int64, batch.device)) for proc, rows in groups.values())


class ProcessorRunner:
    """Runs step 1 for one Sampler: keeps its processors in step with the batch.

    The runner remembers the row identities (``batch.row_uids``) its processors last
    saw; a different batch object counts as "every old row removed, every row added".
    """

    def __init__(self, processors: Sequence[LogitsProcessor]) -> None:
        for p in processors:
            if not isinstance(p, LogitsProcessor):
                raise InvalidSamplingParams(f"processors must be LogitsProcessor instances, got {type(p).__name__}")
        self.processors = tuple(processors)
        self._batch: weakref.ref | None = None
        self._uids: list[Any] = []

    def validate(self, rid: str, params: SamplingParams) -> None:
        """Every registered processor's ``validate_params``; errors name the request,
        the processor and (through the processor's message) the field."""
        for proc in self.processors:
            try:
                proc.validate_params(params)
            except ValueError as e:
                raise InvalidSamplingParams(f"request {rid!r} rejected by {type(proc).__name__}: {e}") from e

    def sync(self, batch: BatchView) -> BatchUpdate | None:
        """Deliver the pending update to every processor (validating added rows first,
        so a rejected request leaves every processor untouched)."""
        if not self.processors:
            return None
        same = self._batch is not None and self._batch() is batch
        old = self._uids if same else [("gone", i) for i in range(len(self._uids))]
        old_set = set(old)
        for j, u in enumerate(batch.row_uids):
            if u not in old_set:
                r = batch.requests[j]
                self.validate(r.rid, r.params)
        update = batch.update_since(old)
        for proc in self.processors:
            proc.update_state(update)
        self._batch = weakref.ref(batch)
        self._uids = list(batch.row_uids)
        return update

    def run(self, logits: torch.Tensor, batch: BatchView) -> torch.Tensor:
        """Step 1. Returns ``logits`` itself when nothing applied, else a new tensor."""
        self.sync(batch)
        x = logits
        shape, dev = tuple(logits.shape), logits.device
        if self.processors:
            all_greedy = batch.is_all_greedy
            g_rows = batch.greedy.nonzero().flatten()
            for proc in self.processors:
                inv = proc.is_argmax_invariant()
                if inv and all_greedy:
                    continue
                inp = logits.clone() if x is logits else x
                keep = inp.index_select(0, g_rows) if inv and g_rows.numel() else None
                out = proc.apply(inp)
                _check_out(type(proc).__name__, out, shape, dev)
                if keep is not None:
                    out = out.index_copy(0, g_rows, keep)
                x = out
        groups = batch.derived("request_processors", lambda: _request_groups(batch))
        for proc, rows, idx in groups:
            info = [
                RowInfo(
                    batch.requests[i].rid, batch.requests[i].params, batch.requests[i].prompt_ids, batch.output_ids[i]
                )
                for i in rows
            ]
            out = proc(x.index_select(0, idx), info)
            _check_out(getattr(proc, "__name__", type(proc).__name__), out, (len(rows), shape[1]), dev)
            x = (logits.clone() if x is logits else x).index_copy_(0, idx, out)
        return x
