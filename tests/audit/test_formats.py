"""detsample.audit.inputs.formats: one table of formats. Pins the bug that a format was
dispatched on a string in four places (detection, opening, sharding, reading; .npz alone
needed close()), so adding one took a reader minutes of grep: here a new format is one
Source and one table row, and the audit reads it with no other change."""

from __future__ import annotations

import json

import pytest

from detsample.audit import audit
from detsample.audit.inputs import formats
from detsample.audit.inputs.formats import FORMATS, Format, format_of
from detsample.audit.inputs.readers import iter_record_chunks
from detsample.audit.inputs.source import Source, row_shards
from detsample.audit.issues import AuditInputError
from tests.audit.synth import synth_rollouts, to_records


class _TsvOfJson(Source):
    """A toy format: one JSON record per line after a tab-separated row number."""

    closed: list[str] = []

    def __init__(self, path: str) -> None:
        self.path = path
        lines = open(path).read().splitlines()
        self.records = [json.loads(ln.split("\t", 1)[1]) for ln in lines]
        self.num_sequences = len(self.records)

    def columns(self) -> list[str]:
        return list(self.records[0]) if self.records else []

    def bind(self, resolved):
        self.resolved = resolved
        return self

    def iter_chunks(self, start, stop, chunk_tokens):
        return iter_record_chunks(self.records[start:stop], self.resolved, self.path)

    def close(self) -> None:
        _TsvOfJson.closed.append(self.path)


def test_a_format_is_one_source_and_one_table_row(tmp_path, monkeypatch):
    records = to_records(synth_rollouts(12, seed=3))
    path = tmp_path / "r.tsvj"
    path.write_text("".join(f"{i}\t{json.dumps(r)}\n" for i, r in enumerate(records)))
    monkeypatch.setattr(formats, "FORMATS", (*FORMATS, Format("tsvj", (".tsvj",), _TsvOfJson)))
    rep = audit(str(path), workers=1)
    want = audit(records)
    assert rep["sequences"] == want["sequences"] == 12
    assert rep["max_abs_diff"] == want["max_abs_diff"] and rep["tokens"] == want["tokens"]
    assert _TsvOfJson.closed and set(_TsvOfJson.closed) == {str(path)}  # every shard closed


@pytest.mark.parametrize(
    "name,fmt", [("a.JSONL", "jsonl"), ("b.ndjson", "jsonl"), ("c.npz", "npz"), ("d.pq", "parquet"), ("e.pth", "pt")]
)
def test_format_of_reads_the_ending(name, fmt):
    assert format_of(name).name == fmt


def test_unknown_and_unwritable_formats_are_named():
    with pytest.raises(
        AuditInputError,
        match=r"x\.csv: unknown input format \(expected "
        r"\.jsonl, \.npz, \.parquet or \.pt\)",
    ):
        format_of("x.csv")
    with pytest.raises(
        AuditInputError,
        match=r"unknown output format \(expected \.jsonl, "
        r"\.npz or \.parquet\)",
    ):
        format_of("x.pt", written=True)


def test_row_shards_cover_the_rows_in_order():
    for n in (0, 1, 5, 17):
        for parts in (1, 2, 3, 8):
            cuts = row_shards(n, parts)
            assert cuts[0][0] == 0 and cuts[-1][1] == n and len(cuts) <= max(parts, 1)
            assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
