"""Batch-composition changes as logits processors see them (the vLLM v1 model).

A :class:`BatchUpdate` describes how the rows of a batch changed since a processor last
saw it. A processor applies it in this order:

1. ``removed``: these row indices become empty;
2. ``added``: ``AddedRequest(index, params, prompt_ids, output_ids_ref)`` fills slot
   ``index`` (empty, past the end, or holding a finished row it replaces: vLLM's builder
   adds over finished rows without removing them first); ``output_ids_ref`` is the batch's live list,
   which ``SamplingBatch.advance`` appends to;
3. ``moved``: ``(src, dst, UNIDIRECTIONAL)`` moves the row at ``src`` into slot ``dst``
   (``src`` becomes empty; a row at ``dst`` is dropped); ``(src, dst, SWAP)`` exchanges
   two rows;

after which rows ``0 .. batch_size - 1`` are exactly the batch's rows and every slot at
or past ``batch_size`` is empty. :func:`diff_update` derives the update from the rows'
stable identities (``SamplingBatch.row_uids``); it is None when nothing changed.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from detsample.errors import DetsampleError


class MoveDirectionality(enum.Enum):
    UNIDIRECTIONAL = "unidirectional"
    SWAP = "swap"


@dataclass(frozen=True)
class AddedRequest:
    index: int
    params: Any  # SamplingParams
    prompt_ids: Sequence[int]
    output_ids_ref: list  # the batch's live output list (advance appends to it)

    def __iter__(self):  # allows ``index, params, prompt, out = added``
        return iter((self.index, self.params, self.prompt_ids, self.output_ids_ref))


@dataclass(frozen=True)
class BatchUpdate:
    batch_size: int
    removed: tuple[int, ...] = ()
    added: tuple[AddedRequest, ...] = ()
    moved: tuple[tuple[int, int, MoveDirectionality], ...] = ()


def diff_update(old_uids: Sequence[Any], new_uids: Sequence[Any], added_info) -> BatchUpdate | None:
    """The update turning a processor's view ``old_uids`` (slot -> row identity) into
    ``new_uids``. ``added_info(j)`` gives ``(params, prompt_ids, output_ids_ref)`` of new
    row ``j``. Added rows take the lowest free slots; then a single left-to-right pass
    places each row with one move (into an empty slot) or one swap."""
    old, new = list(old_uids), list(new_uids)
    if old == new:
        return None
    new_set = set(new)
    old_pos = {u: i for i, u in enumerate(old)}
    removed = tuple(i for i, u in enumerate(old) if u not in new_set)
    slots: dict[int, Any] = {i: u for i, u in enumerate(old) if u in new_set}
    free = sorted(set(range(max(len(old), len(new)) + len(new))) - set(slots))
    added = []
    fi = 0
    for j, u in enumerate(new):
        if u not in old_pos:
            s = free[fi]
            fi += 1
            slots[s] = u
            added.append(AddedRequest(s, *added_info(j)))
    pos = {u: s for s, u in slots.items()}
    moved = []
    for j, u in enumerate(new):
        p = pos[u]
        if p == j:
            continue
        other = slots.get(j)
        if other is None:
            moved.append((p, j, MoveDirectionality.UNIDIRECTIONAL))
            del slots[p]
        else:
            moved.append((p, j, MoveDirectionality.SWAP))
            slots[p] = other
            pos[other] = p
        slots[j] = u
        pos[u] = j
    return BatchUpdate(batch_size=len(new), removed=removed, added=tuple(added), moved=tuple(moved))


class InvalidBatchUpdate(DetsampleError, ValueError):
    """An update that names an empty slot where a row must be, or leaves the slots
    other than rows ``0 .. batch_size - 1``."""


def apply_to_slots(slots: list, update: BatchUpdate | None, make) -> list:
    """Reference application of ``update`` to a slot list (tests and simple
    processors): ``make(added)`` builds the entry of an added row. Returns the new
    list of length ``update.batch_size``.

    As vLLM's persistent batch produces them: an add into an occupied slot replaces its
    entry (the finished request there is dropped without a ``removed`` entry), and a
    one-way move onto an occupied slot drops the entry there. Raises
    :class:`InvalidBatchUpdate` for a removal or move of an empty slot, a swap with an
    empty slot, or slots that are not exactly ``0 .. batch_size - 1`` afterwards."""
    if update is None:
        return slots
    s = dict(enumerate(slots))
    for i in update.removed:
        _need(i in s, f"removed slot {i} is empty")
        del s[i]
    for a in update.added:
        s[a.index] = make(a)  # replaces an entry there (vLLM's add over a finished row)
    for src, dst, d in update.moved:
        _need(src in s, f"move from empty slot {src}")
        if d is MoveDirectionality.SWAP:
            _need(dst in s, f"swap with empty slot {dst}")
            s[src], s[dst] = s[dst], s[src]
        else:
            s[dst] = s.pop(src)  # drops an entry at dst
    n = update.batch_size
    _need(sorted(s) == list(range(n)), f"slots {sorted(s)} after an update of size {n}")
    return [s[i] for i in range(n)]


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidBatchUpdate(f"invalid BatchUpdate: {message}")


class BatchView(Protocol):
    """What the processors and the penalty/constraint step read of a batch.

    :class:`detsample.SamplingBatch` implements it; naming the protocol here keeps this
    package below the batch in the layering (docs/architecture.md) instead of importing it.
    """

    requests: Sequence[Any]  # the rows' Request objects, in row order
    params: Sequence[Any]  # their SamplingParams
    output_ids: Sequence[list[int]]  # live per-row output lists
    row_eos: Sequence[tuple[int, ...]]
    row_uids: Sequence[Any]
    device: torch.device
    greedy: torch.Tensor  # [B] bool
    penalties: Any  # PenaltyState | None
    is_all_greedy: bool

    def update_since(self, old_uids: Sequence[Any]) -> BatchUpdate | None: ...

    def constraint_rows(self) -> Any: ...

    def derived(self, key: Any, build: Any) -> Any: ...
