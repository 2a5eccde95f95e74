"""detsample/batch_update.py and the updates SamplingBatch.filter/merge produce.

Pins: an update that leaves a processor's slots out of step with the batch (wrong
order of removed/added/moved, a move into an occupied slot, rows left past
batch_size), an update where nothing changed (must be None), and added rows whose
output_ids_ref is a copy instead of the batch's live list.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import Request, SamplingBatch, SamplingParams
from detsample.processors.batch_update import MoveDirectionality as MD
from detsample.processors.batch_update import apply_to_slots, diff_update


@settings(max_examples=200, deadline=None)
@given(st.permutations(range(8)).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, 8), st.integers(0, 4))))
def test_diff_update_reaches_the_new_layout(args):
    perm, n_keep, n_add = args
    old = list(perm)
    new = old[:n_keep] + [100 + i for i in range(n_add)]
    upd = diff_update(old, new, lambda j: (None, (), [new[j]]))
    assert (upd is None) == (old == new)
    assert apply_to_slots(old, upd, lambda a: a.output_ids_ref[0]) == new


# name, filter indices, expected (removed, moved)
FILTERS = [
    ("drop-last", [0, 1], ((2,), ())),
    ("drop-first", [1, 2], ((0,), ((1, 0, MD.UNIDIRECTIONAL), (2, 1, MD.UNIDIRECTIONAL)))),
    ("swap", [1, 0, 2], ((), ((1, 0, MD.SWAP),))),
    ("reverse", [2, 1, 0], ((), ((2, 0, MD.SWAP),))),
    ("keep-one-moved", [2], ((0, 1), ((2, 0, MD.UNIDIRECTIONAL),))),
    ("drop-all", [], ((0, 1, 2), ())),
]


def _batch(n, start=0):
    return SamplingBatch.from_requests(
        [Request(f"r{start + i}", SamplingParams(seed=start + i), [1], [2]) for i in range(n)], 8
    )


@pytest.mark.parametrize("name,keep,want", FILTERS, ids=[f[0] for f in FILTERS])
def test_filter_produces_exact_update(name, keep, want):
    b = _batch(3)
    upd = b.filter(keep)
    assert (upd.removed, upd.moved, upd.added, upd.batch_size) == (*want, (), len(keep))


def test_no_change_is_none():
    b = _batch(3)
    assert b.filter([0, 1, 2]) is None
    assert b.merge(_batch(0)) is None


def test_merge_adds_with_live_output_refs():
    a, b = _batch(2), _batch(2, start=2)
    upd = a.merge(b)
    assert upd.batch_size == 4 and upd.removed == () and upd.moved == ()
    assert [x.index for x in upd.added] == [2, 3]
    assert [x.params.seed for x in upd.added] == [2, 3]
    a.advance([1, 2, 3, 4])
    assert upd.added[0].output_ids_ref == [2, 3]  # the live list advance appends to
    assert upd.added[0].output_ids_ref is a.output_ids[2]
    index, params, prompt, out = upd.added[1]  # unpacks like vLLM's tuple
    assert (index, params.seed, list(prompt), out) == (3, 3, [1], [2, 4])


def test_update_since_composes_several_changes():
    b = _batch(4)
    old = list(b.row_uids)
    b.filter([3, 1])
    b.merge(_batch(1, start=9))
    b.filter([2, 0])
    upd = b.update_since(old)
    assert apply_to_slots(["r0", "r1", "r2", "r3"], upd, lambda a: f"r{a.params.seed}") == [r.rid for r in b.requests]
