"""Audit readers: JSONL, NPZ and Parquet give the same report; binary-format errors are
named (detsample/auditio.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from detsample.audit import AuditInputError, audit, to_json
from detsample.audit.inputs.npz import NpzSource
from detsample.audit.inputs.readers import split_jsonl
from tests.audit.synth import synth_rollouts, write_jsonl, write_npz, write_parquet

WRITERS = [
    ("jsonl", "r.jsonl", write_jsonl),
    ("npz", "r.npz", write_npz),
    ("npz-compressed", "r.npz", lambda c, p: write_npz(c, p, compressed=True)),
    ("parquet", "r.parquet", lambda c, p: write_parquet(c, p, row_group_size=37)),
]


def metrics_only(report: dict) -> dict:
    """The report without file names and locations (which differ between formats)."""
    rep = dict(report)
    rep.pop("sources")
    rep["worst_sequences"] = [
        {k: v for k, v in w.items() if k not in ("source", "line", "row")} for w in rep["worst_sequences"]
    ]
    return rep


@pytest.fixture(scope="module")
def rollouts():
    return synth_rollouts(180, seed=11, mismatch_rate=0.4)


@pytest.fixture(scope="module")
def jsonl_report(rollouts, tmp_path_factory):
    path = tmp_path_factory.mktemp("jsonl") / "r.jsonl"
    write_jsonl(rollouts, str(path))
    return audit(str(path))


@pytest.mark.parametrize("name,filename,writer", WRITERS)
def test_formats_give_identical_reports(rollouts, jsonl_report, tmp_path, name, filename, writer):
    """Pins format independence: float32 columns in NPZ/Parquet and their JSON decimal
    renderings audit to the same bits."""
    path = tmp_path / filename
    writer(rollouts, str(path))
    rep = audit(str(path), chunk_tokens=500)
    assert to_json(metrics_only(rep)) == to_json(metrics_only(jsonl_report))
    assert rep["sequences"] == 180


def test_npz_stored_members_are_memory_mapped(rollouts, tmp_path):
    """Pins streaming: uncompressed members are memmaps, compressed ones are streamed."""
    write_npz(rollouts, str(tmp_path / "a.npz"))
    write_npz(rollouts, str(tmp_path / "b.npz"), compressed=True)
    a, b = NpzSource(str(tmp_path / "a.npz")), NpzSource(str(tmp_path / "b.npz"))
    assert a.arrays["engine_logprobs"]._mm is not None
    assert b.arrays["engine_logprobs"]._mm is None
    assert np.array_equal(a.arrays["engine_logprobs"].read(5, 50), b.arrays["engine_logprobs"].read(5, 50))
    a.close()
    b.close()


def _npz(tmp_path, **arrays):
    path = tmp_path / "x.npz"
    np.savez(path, **arrays)
    return str(path)


def _good_npz_arrays():
    off = np.array([0, 2, 3])
    return dict(
        id=np.array(["a", "b"]),
        prompt_ids=np.array([1, 2]),
        prompt_ids_offsets=np.array([0, 1, 2]),
        response_ids=np.array([5, 6, 7]),
        response_ids_offsets=off,
        engine_logprobs=np.array([-1.0, -2.0, -3.0]),
        engine_logprobs_offsets=off,
        trainer_logprobs=np.array([-1.0, -2.0, -3.5]),
        trainer_logprobs_offsets=off,
    )


NPZ_FATAL = [
    ("missing-id", dict(id=None), "missing column 'id'"),
    ("missing-offsets", dict(engine_logprobs_offsets=None), "engine_logprobs_offsets"),
    (
        "decreasing-offsets",
        dict(engine_logprobs_offsets=np.array([0, 3, 2]), engine_logprobs=np.array([-1.0, -2.0])),
        "ragged offsets",
    ),
    ("short-offsets", dict(trainer_logprobs_offsets=np.array([0, 3])), r"len\(id\) \+ 1"),
    ("last-offset", dict(trainer_logprobs=np.array([-1.0, -2.0, -3.0, -4.0])), "last offset"),
    ("2-d", dict(engine_logprobs=np.zeros((3, 1))), "flat"),
    (
        "object-lists",
        dict(response_ids=np.array([[5, 6], [7]], dtype=object)),
        "store flat values with 'response_ids_offsets'",
    ),
    # Bug pinned: pandas' object-dtype string ids were told to use a nonexistent 'id_offsets'.
    (
        "object-ids",
        dict(id=np.array(["a", "b"], dtype=object)),
        r"id: object arrays are not supported; store the ids as a string \(dtype=str\) or integer",
    ),
    # Bug pinned: float128 logprobs reached the comparison and failed there ("data type
    # 'u16' not understood", a traceback); complex ones were compared as numbers.
    (
        "float128",
        dict(engine_logprobs=np.array([-1.0, -2.0, -3.0], dtype=np.longdouble)),
        "engine_logprobs: dtype float128 is not supported",
    ),
    (
        "complex",
        dict(trainer_logprobs=np.array([-1.0, -2.0, -3.5], dtype=np.complex64)),
        "trainer_logprobs: dtype complex64 is not supported",
    ),
]


@pytest.mark.parametrize("name,change,text", NPZ_FATAL)
def test_npz_structural_errors_name_file_and_column(tmp_path, name, change, text):
    arrays = _good_npz_arrays()
    for k, v in change.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v
    path = _npz(tmp_path, **arrays)
    with pytest.raises(AuditInputError, match=text) as info:
        audit(path)
    assert path in str(info.value)


@pytest.mark.parametrize("padded", [False, True], ids=["ragged", "padded"])
def test_an_npz_sequence_beyond_the_stated_limit_is_refused_before_its_values(tmp_path, monkeypatch, padded):
    """The bug: a 1.4 MB compressed NPZ of one 6e7-token sequence took 5 GB. A sequence
    longer than AUDIT_SEQUENCE_TOKENS (16 M; 2 here) is named with its length, from the
    offsets or the padded width, before a value is read."""
    from detsample.audit.inputs import npz
    from detsample.inputs import AUDIT_SEQUENCE_TOKENS

    assert AUDIT_SEQUENCE_TOKENS == 1 << 24
    monkeypatch.setattr(npz, "AUDIT_SEQUENCE_TOKENS", 2)
    arrays = _good_npz_arrays()  # sequence 0 has 2 response tokens: allowed
    assert audit(_npz(tmp_path, **arrays))["sequences"] == 2
    if padded:
        for c in ("response_ids", "engine_logprobs", "trainer_logprobs"):
            arrays.pop(f"{c}_offsets")
            arrays[c] = np.zeros((2, 3), dtype=np.int64 if c == "response_ids" else np.float64)
        text = "a padded row has 3 tokens"
    else:
        arrays["response_ids_offsets"] = np.array([0, 0, 3])
        text = "sequence 1 has 3 tokens"
    with pytest.raises(AuditInputError, match=f"response_ids: {text}, more than the 2 a sequence"):
        audit(_npz(tmp_path, **arrays))


def test_more_sequences_than_memory_holds_are_refused_before_any_value(tmp_path, monkeypatch):
    """The bug: a 46 MB NPZ of 3e7 empty sequences took 17 GB resident (the audit holds
    ~600 bytes a sequence). The sequences a file states are sized at AUDIT_SEQUENCE_BYTES
    each against 1/4 of the machine's memory before any value is read (here a machine of
    4 sequences' worth: 2 fit, 3 do not)."""
    from detsample.inputs import AUDIT_SEQUENCE_BYTES, limits

    path = _npz(tmp_path, **_good_npz_arrays())  # 2 sequences
    monkeypatch.setattr(limits, "memory_bytes", lambda: 4 * 4 * AUDIT_SEQUENCE_BYTES)
    assert audit(path)["sequences"] == 2
    monkeypatch.setattr(limits, "memory_bytes", lambda: 4 * AUDIT_SEQUENCE_BYTES)
    with pytest.raises(AuditInputError, match="auditing 2 sequences needs .* split the file") as info:
        audit(path)
    assert str(info.value).startswith(path)


def test_npz_row_errors_are_excluded_with_row(tmp_path):
    """Pins row-level checks in NPZ: count mismatch between columns, NaN, missing column."""
    arrays = _good_npz_arrays()
    arrays["trainer_logprobs"] = np.array([-1.0, -2.0])
    arrays["trainer_logprobs_offsets"] = np.array([0, 1, 2])  # row 0: 1 value for 2 tokens
    arrays["engine_logprobs"] = np.array([-1.0, -2.0, np.nan])  # row 1: NaN
    rep = audit(_npz(tmp_path, **arrays))
    assert rep["sequences"] == 0 and rep["excluded_sequences"] == 2
    assert [(i["row"], i["field"], i["kind"]) for i in rep["issues"]] == [
        (0, "trainer_logprobs", "count_mismatch"),
        (1, "engine_logprobs", "nan"),
    ]
    arrays = _good_npz_arrays()
    arrays.pop("engine_logprobs"), arrays.pop("engine_logprobs_offsets")
    rep = audit(_npz(tmp_path, **arrays))
    assert rep["excluded_by_kind"] == {"missing_column": 2}
    with pytest.raises(AuditInputError, match="row 0: engine_logprobs: missing column"):
        audit(_npz(tmp_path, **arrays), strict=True)


def test_parquet_errors(tmp_path):
    """Pins Parquet checks: a scalar where a list belongs and a missing id column are fatal;
    nulls, values of the wrong kind (list<string> logprobs) and count mismatches exclude
    their rows (the rule of every format, tests/audit/test_values.py)."""
    t = pa.table(
        {
            "id": ["a", "b", "c"],
            "prompt_ids": [[1], [1], [1]],
            "response_ids": [[5, 6], [7], [8]],
            "engine_logprobs": [[-1.0, -2.0], [-1.0], [-1.0]],
            "trainer_logprobs": [[-1.0, None], [-1.0, -2.0], None],
        }
    )
    path = str(tmp_path / "x.parquet")
    pq.write_table(t, path)
    rep = audit(path)
    assert [(i["row"], i["field"], i["kind"]) for i in rep["issues"]] == [
        (0, "trainer_logprobs", "bad_type"),
        (1, "trainer_logprobs", "count_mismatch"),
        (2, "trainer_logprobs", "missing_column"),
    ]
    pq.write_table(t.set_column(3, "engine_logprobs", pa.array([["x"], ["y"], ["z"]])), path)
    rep = audit(path)
    assert (
        rep["excluded_by_kind"] == {"bad_type": 3}
        and rep["issues"][1]["message"] == "engine_logprobs[0] = 'y' (values must be numbers)"
    )
    pq.write_table(t.set_column(3, "engine_logprobs", pa.array([1.0, 2.0, 3.0])), path)
    with pytest.raises(AuditInputError, match="engine_logprobs: must be a list column"):
        audit(path)
    pq.write_table(t.drop(["id"]), path)
    with pytest.raises(AuditInputError, match="missing column 'id'"):
        audit(path)


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(AuditInputError, match="unknown input format"):
        (tmp_path / "x.csv").write_text("")
        audit(str(tmp_path / "x.csv"))
    with pytest.raises(AuditInputError, match="no such file"):
        audit(str(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize("parts", [1, 2, 3, 7, 50])
def test_split_jsonl_covers_file_on_line_boundaries(tmp_path, parts):
    """Pins shard planning: ranges tile the file, start at line starts, count lines right."""
    lines = [f'{{"n": {i}{" " * (i % 13)}}}' for i in range(40)]
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join(lines) + "\n")
    data = path.read_bytes()
    shards = split_jsonl(str(path), parts)
    assert shards[0][0] == 0 and shards[-1][1] == len(data)
    for (a, b, line), (a2, _, _) in zip(shards, shards[1:] + [(len(data), 0, 0)]):
        assert b == a2 and (a == 0 or data[a - 1 : a] == b"\n")
        assert line == data[:a].count(b"\n") + 1


def test_arrow_and_python_jsonl_parsers_agree(rollouts, tmp_path):
    """Pins the JSONL fast path: pyarrow blocks and json line by line give the same bits,
    on clean blocks, blocks with every kind of bad line, blank lines, int ids, no mask."""
    from tests.audit.test_validate import BAD_LINES

    path = tmp_path / "r.jsonl"
    write_jsonl(rollouts, str(path))
    lines = path.read_text().splitlines()
    lines[5] = lines[5].replace('"id": "seq-11-5"', '"id": 5')
    for k, (_, bad, *_rest) in enumerate(BAD_LINES):
        lines.insert(10 + 7 * k, bad)
    lines.insert(3, "")
    lines.insert(150, "   ")
    path.write_text("\n".join(lines))  # no final newline
    for chunk_tokens in (300, 10**6):
        fast = audit(str(path), chunk_tokens=chunk_tokens)
        slow = audit(str(path), chunk_tokens=chunk_tokens, jsonl_parser="python")
        assert to_json(fast) == to_json(slow)
    assert fast["excluded_sequences"] == len(BAD_LINES)


def test_arrow_jsonl_fast_path_is_taken_on_clean_blocks(rollouts, tmp_path):
    from detsample.audit.inputs.layout import DEFAULT_LAYOUT, resolve
    from detsample.audit.inputs.readers import _arrow_jsonl_block, peek_jsonl_keys

    path = tmp_path / "r.jsonl"
    write_jsonl(rollouts, str(path))
    data = path.read_bytes()
    res = resolve(DEFAULT_LAYOUT, peek_jsonl_keys(str(path)), str(path))
    chunk = _arrow_jsonl_block(data, str(path), np.arange(1, 181), res)
    assert chunk is not None and len(chunk) == 180
    assert _arrow_jsonl_block(data.replace(b"[", b"[NaN, ", 1), str(path), np.arange(1, 181), res) is None


COLUMN_PROBLEMS = [  # (engine_logprobs value, issue kind)
    ([[-1.0], [-2.0]], "ragged"),
    ([[-1.0], [-2.0, -3.0]], "ragged"),
    (["2 dimensions"], "bad_type"),
    (["not a flat list"], "bad_type"),
    ([True], "bad_type"),
]


@pytest.mark.parametrize("value,kind", COLUMN_PROBLEMS)
def test_column_problem_kind_does_not_depend_on_message_wording(value, kind):
    """Bug pinned: a column problem was classified "ragged" when its message contained
    the words "dimensions" or "flat list", so a string value quoting those words was
    reported as ragged. The reader now names the kind where it finds the problem."""
    rec = {"id": "a", "prompt_ids": [1], "response_ids": [2], "engine_logprobs": value, "trainer_logprobs": [-1.0]}
    issues = audit([rec])["issues"]
    assert [(i["field"], i["kind"]) for i in issues] == [("engine_logprobs", kind)]
