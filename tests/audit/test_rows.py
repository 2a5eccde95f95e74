"""detsample.audit.analysis.rows: the report's row tables. Pins that only the sequences the
tables can still take are read -- the bug: an audit of 3e7 exact or empty sequences made
a Python call per sequence (the token table never fills when nothing differs), past 120 s
-- with the same tables as reading every sequence in order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.audit.analysis import rows as R
from detsample.audit.inputs.table import AuditBatch


def _batch(lengths, seed, diff_rate, mask_rate, dtype):
    rng = np.random.default_rng(seed)
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T = int(off[-1])
    engine = (-rng.random(T) * 3).astype(dtype)
    trainer = engine.copy()
    flip = rng.random(T) < diff_rate
    trainer[flip] = (trainer[flip] - 0.25).astype(dtype)
    mask = rng.random(T) >= mask_rate
    n = len(lengths)
    return AuditBatch(
        "f", "row", [f"s{i}" for i in range(n)], np.arange(n), off, rng.integers(0, 100, T), engine, trainer, mask
    )


def _every_row(tables: R.RowTables, b: AuditBatch) -> None:
    for i in range(len(b)):  # the reference: every sequence in order until both are full
        if tables.full():
            return
        tables._sequence(b, i)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), min_size=0, max_size=400),
    seed=st.integers(0, 99),
    diff_rate=st.sampled_from([0.0, 0.001, 0.05, 0.5]),
    mask_rate=st.sampled_from([0.0, 0.3]),
    dtype=st.sampled_from([np.float32, np.float64]),
    prior=st.integers(0, 260),
    compare=st.sampled_from([None, "float32"]),
)
def test_tables_equal_reading_every_sequence(lengths, seed, diff_rate, mask_rate, dtype, prior, compare):
    b = _batch(lengths, seed, diff_rate, mask_rate, dtype)
    fast, slow = R.RowTables(compare), R.RowTables(compare)
    for t in (fast, slow):  # tables part-filled by an earlier batch
        t.sequences = [{"id": "p"}] * min(prior, R.MAX_SEQUENCE_ROWS)
        t.tokens = [{"id": "p"}] * (prior % (R.MAX_TOKEN_ROWS + 1))
    fast.update(b)
    _every_row(slow, b)
    assert fast.report() == slow.report()


def test_a_batch_of_exact_sequences_reads_only_the_first_ones(monkeypatch):
    b = _batch([3] * 5000, 0, 0.0, 0.0, np.float32)
    calls = []
    real = R.RowTables._sequence
    monkeypatch.setattr(R.RowTables, "_sequence", lambda self, b, i: (calls.append(i), real(self, b, i)))
    t = R.RowTables(None)
    t.update(b)
    assert calls == list(range(R.MAX_SEQUENCE_ROWS)) and not t.tokens


def test_differing_sequences_past_the_table_are_read_once_in_order():
    b = _batch([2] * 400, 0, 0.0, 0.0, np.float64)
    for seq in (5, 300, 399):
        b.trainer[b.offsets[seq] + 1] -= 1.0
    t = R.RowTables(None)
    t.update(b)
    assert [(r["id"], r["position"]) for r in t.tokens] == [("s5", 1), ("s300", 1), ("s399", 1)]
    assert len(t.sequences) == R.MAX_SEQUENCE_ROWS
