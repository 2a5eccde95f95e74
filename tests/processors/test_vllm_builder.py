"""Updates as vLLM's persistent batch builds them, replayed into ``apply_to_slots``.

vLLM's builder (its documented algorithm) adds new requests over finished ones without
removing them first, removes the finished rows it cannot refill, condenses the batch by
one-way moves from the highest occupied slot into the lowest hole -- or, as its contract
allows, straight onto a finished row -- and may then swap rows. Bugs pinned: the two
shapes a slot list built for our own updates refused (an add into an occupied slot; a
one-way move onto an occupied slot), so that a processor written against vLLM's contract
crashed; a replaced row's entry surviving its replacement; invalid updates (a move from
an empty slot) passing silently.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.processors.base import SlotProcessor
from detsample.processors.batch_update import AddedRequest, BatchUpdate, InvalidBatchUpdate, apply_to_slots
from detsample.processors.batch_update import MoveDirectionality as MD

UNI, SWAP = MD.UNIDIRECTIONAL, MD.SWAP


def _add(i, rid):
    return AddedRequest(i, None, (), [rid])


def _entry(a):
    return a.output_ids_ref[0]


def vllm_step(batch, finished, new, swaps, overwrite):
    """One engine step of vLLM's builder: ``(BatchUpdate, the new batch)``."""
    slots = dict(enumerate(batch))
    fin = sorted(i for i, r in slots.items() if r in finished)
    added, removed, moved = [], [], []
    for i, rid in zip(fin, new):  # refill finished rows, lowest index first
        slots[i] = rid
        added.append(_add(i, rid))
    rest, new = fin[len(added) :], new[len(added) :]
    nxt = len(batch)
    for rid in new:  # extend past the current max index
        slots[nxt] = rid
        added.append(_add(nxt, rid))
        nxt += 1
    for f in rest:
        live = [i for i in slots if i not in rest and i > f]
        if overwrite and live:  # a one-way move straight onto the finished row
            h = max(live)
            slots[f] = slots.pop(h)
            moved.append((h, f, UNI))
            continue
        removed.append(f)
        del slots[f]
    while slots and max(slots) >= len(slots):  # condense: highest into the lowest hole
        lo = min(set(range(len(slots))) - set(slots))
        hi = max(slots)
        slots[lo] = slots.pop(hi)
        moved.append((hi, lo, UNI))
    n = len(slots)
    for i, j in swaps:
        if i < n and j < n and i != j:
            slots[i], slots[j] = slots[j], slots[i]
            moved.append((i, j, SWAP))
    return (BatchUpdate(n, tuple(removed), tuple(added), tuple(moved)), [slots[i] for i in range(n)])


def test_the_documented_examples():
    # 1 new, 2 finished, one swap: [A,B,C,D] -> [B,E,D]
    upd = BatchUpdate(3, removed=(2,), added=(_add(0, "E"),), moved=((3, 2, UNI), (0, 1, SWAP)))
    assert apply_to_slots(list("ABCD"), upd, _entry) == list("BED")
    # 2 new, 1 finished, one swap: [A,B,C,D] -> [B,A,E,D,F]
    upd = BatchUpdate(5, added=(_add(2, "E"), _add(4, "F")), moved=((0, 1, SWAP),))
    assert apply_to_slots(list("ABCD"), upd, _entry) == list("BAEDF")
    # a one-way move onto an occupied slot drops the row there: [A,B,C,D] -> [A,D,C]
    upd = BatchUpdate(3, moved=((3, 1, UNI),))
    assert apply_to_slots(list("ABCD"), upd, _entry) == list("ADC")


class _Recorder(SlotProcessor):
    def make_entry(self, added):
        return _entry(added)

    def is_argmax_invariant(self):
        return True

    def apply(self, logits):
        return logits


@settings(max_examples=150)
@given(
    st.lists(
        st.tuples(
            st.sets(st.integers(0, 9)),
            st.integers(0, 4),
            st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=2),
            st.booleans(),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_replayed_builder_sequences_keep_a_processor_in_step(steps):
    batch, proc, serial = [], _Recorder(), 0
    for finish, n_new, swaps, overwrite in steps:
        finished = {batch[i] for i in finish if i < len(batch)}
        new = [f"q{serial + k}" for k in range(n_new)]
        serial += n_new
        upd, batch = vllm_step(batch, finished, new, swaps, overwrite)
        proc.update_state(upd if (upd.removed or upd.added or upd.moved) else None)
        assert proc.slots == batch


@pytest.mark.parametrize(
    "upd, match",
    [
        (BatchUpdate(2, removed=(5,)), "removed slot 5 is empty"),
        (BatchUpdate(2, moved=((4, 0, UNI),)), "move from empty slot 4"),
        (BatchUpdate(3, moved=((0, 4, SWAP),)), "swap with empty slot 4"),
        (BatchUpdate(3, moved=((1, 4, UNI),)), r"slots \[0, 2, 4\] after an update of size 3"),
    ],
)
def test_invalid_updates_are_named_errors(upd, match):
    with pytest.raises(InvalidBatchUpdate, match=match):
        apply_to_slots(list("ABC"), upd, _entry)
