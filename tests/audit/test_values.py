"""One rule for ids and values in every format (detsample/audit/inputs/values.py): the same value
is accepted or rejected the same way, with the same kind and the same message naming it,
whether it comes from JSONL, NPZ, Parquet, a ``.pt`` of ragged lists, of records or of
padded tensors.

Bugs pinned: token id 2**63 was "got dtype float64" in JSONL (no value named)
and accepted as a uint64 in NPZ (then wrapped to a negative int64); a null id was
``missing_column`` although the docs said ``bad_type``; an object array in a column the
audit does not read made the whole NPZ fatal.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from detsample.audit import audit

BASE = {
    "id": "a",
    "prompt_ids": [1],
    "response_ids": [3, 4],
    "engine_logprobs": [-0.5, -1.0],
    "trainer_logprobs": [-0.5, -1.0],
    "mask": [1, 1],
}
_NP = {
    "response_ids": np.int64,
    "prompt_ids": np.int64,
    "engine_logprobs": np.float64,
    "trainer_logprobs": np.float64,
    "mask": np.int64,
}

# (name, column, value, numpy dtype, arrow value type, torch dtype, kind, message);
# kind None: accepted. np/arrow/torch None: the format cannot hold that value.
CASES = [
    (
        "uint64-token",
        "response_ids",
        [3, 2**63],
        np.uint64,
        pa.uint64(),
        torch.uint64,
        "bad_type",
        "response_ids[1] = 9223372036854775808 (out of the int64 range)",
    ),
    (
        "float-token",
        "response_ids",
        [3.5, 4.0],
        np.float64,
        pa.float64(),
        torch.float64,
        "bad_type",
        "response_ids[0] = 3.5 (values must be integers)",
    ),
    (
        "bool-token",
        "response_ids",
        [True, False],
        np.bool_,
        pa.bool_(),
        torch.bool,
        "bad_type",
        "response_ids[0] = True (values must be integers)",
    ),
    (
        "negative-token",
        "response_ids",
        [3, -4],
        np.int64,
        pa.int64(),
        torch.int64,
        "negative_token_id",
        "response_ids[1] = -4 (token ids must be >= 0)",
    ),
    (
        "string-logprob",
        "engine_logprobs",
        ["x", "y"],
        np.str_,
        pa.string(),
        None,
        "bad_type",
        "engine_logprobs[0] = 'x' (values must be numbers)",
    ),
    (
        "bool-logprob",
        "engine_logprobs",
        [True, False],
        np.bool_,
        pa.bool_(),
        torch.bool,
        "bad_type",
        "engine_logprobs[0] = True (values must be numbers)",
    ),
    (
        "nan-logprob",
        "engine_logprobs",
        [-0.5, float("nan")],
        np.float64,
        pa.float64(),
        torch.float64,
        "nan",
        "engine_logprobs[1] = nan (NaN logprob)",
    ),
    ("int-logprob", "engine_logprobs", [-1, -2], np.int64, pa.int64(), torch.int64, None, None),
    ("mask-2", "mask", [1, 2], np.int64, pa.int64(), torch.int64, "bad_mask", "mask[1] = 2 (mask must be 0 or 1)"),
    (
        "mask-half",
        "mask",
        [1.0, 0.5],
        np.float64,
        pa.float64(),
        torch.float32,
        "bad_mask",
        "mask[1] = 0.5 (mask must be 0 or 1)",
    ),
    ("float-mask", "mask", [1.0, 1.0], np.float64, pa.float64(), torch.float32, None, None),
    ("float-id", "id", 1.5, np.float64, pa.float64(), None, "bad_type", "id must be a string or an integer, got 1.5"),
    ("null-id", "id", None, None, pa.string(), None, "bad_type", "id is null (ids must be strings or integers)"),
    ("int-id", "id", 7, np.int64, pa.int64(), None, None, None),
]


def _record(column, value):
    return dict(BASE, **{column: value})


def _write(fmt, tmp_path, column, value, np_dtype, arrow_type, torch_dtype):
    """The one-sequence file of ``fmt``, or None where the format cannot hold the value."""
    rec = _record(column, value)
    path = tmp_path / f"x.{fmt.split('-')[0]}"
    if fmt == "jsonl":
        path.write_text(json.dumps(rec) + "\n")
    elif fmt == "npz":
        if np_dtype is None:
            return None
        arrays = {"id": np.array([rec["id"]], dtype=np_dtype if column == "id" else None)}
        for c in _NP:
            vals = np.array(rec[c], dtype=np_dtype if c == column else _NP[c])
            arrays[c], arrays[f"{c}_offsets"] = vals, np.array([0, vals.size])
        np.savez(path, **arrays)
    elif fmt == "parquet":
        types = {c: pa.list_(pa.from_numpy_dtype(t)) for c, t in _NP.items()}
        types["id"] = pa.string()
        if column == "id":
            types["id"] = arrow_type
        else:
            types[column] = pa.list_(arrow_type)
        pq.write_table(pa.table({c: pa.array([rec[c]], type=t) for c, t in types.items()}), path)
    elif fmt == "pt-lists":
        torch.save({c: [v] for c, v in rec.items()}, path)
    elif fmt == "pt-records":
        torch.save([rec], path)
    elif fmt == "pt-tensors":
        if column == "id":
            torch.save(
                {
                    c: ([v] if c == "id" else torch.tensor([v], dtype=torch.float64 if "logprob" in c else None))
                    for c, v in rec.items()
                },
                path,
            )
        elif torch_dtype is None:
            return None
        else:
            cols = {"id": [rec["id"]]}
            for c in _NP:
                dt = torch_dtype if c == column else (torch.float64 if "logprob" in c else torch.int64)
                cols[c] = torch.tensor([rec[c]], dtype=dt)
            torch.save(cols, path)
    return str(path)


FORMATS = ["jsonl", "npz", "parquet", "pt-lists", "pt-records", "pt-tensors"]


@pytest.mark.parametrize(
    "name,column,value,np_dtype,arrow_type,torch_dtype,kind,message", CASES, ids=[c[0] for c in CASES]
)
def test_the_same_value_gets_the_same_verdict_in_every_format(
    tmp_path, name, column, value, np_dtype, arrow_type, torch_dtype, kind, message
):
    verdicts = {}
    for fmt in FORMATS:
        path = _write(fmt, tmp_path, column, value, np_dtype, arrow_type, torch_dtype)
        if path is None:
            continue
        rep = audit(path)
        verdicts[fmt] = [(i["field"], i["kind"], i["message"]) for i in rep["issues"]]
        if kind is None:
            assert rep["sequences"] == 1 and rep["tokens"] == 2, (fmt, rep["issues"])
    expected = [] if kind is None else [(column, kind, message)]
    assert verdicts == {fmt: expected for fmt in verdicts}, verdicts
    assert len(verdicts) >= 3  # JSONL and at least two typed formats compared


def test_a_column_the_audit_does_not_read_is_never_opened(tmp_path):
    """An object array (or a malformed member) outside the layout's columns is harmless:
    only the columns the audit uses are read."""
    path = tmp_path / "x.npz"
    off = np.array([0, 2])
    np.savez(
        path,
        id=np.array(["a"]),
        response_ids=np.array([3, 4]),
        response_ids_offsets=off,
        engine_logprobs=np.array([-0.5, -1.0]),
        engine_logprobs_offsets=off,
        trainer_logprobs=np.array([-0.5, -1.0]),
        trainer_logprobs_offsets=off,
        extra=np.array([{"meta": 1}], dtype=object),
        allow_pickle=True,
    )
    rep = audit(str(path))
    assert rep["sequences"] == 1 and rep["tokens"] == 2
    np.savez(
        path,
        id=np.array(["a"]),
        response_ids=np.array([[3, 4]], dtype=object),
        engine_logprobs=np.array([-0.5, -1.0]),
        engine_logprobs_offsets=off,
        allow_pickle=True,
    )
    with pytest.raises(Exception, match="response_ids: object arrays are not supported"):
        audit(str(path))


def test_one_bad_record_never_changes_its_neighbours(tmp_path):
    """Pins the per-record check: one record's float token ids, concatenated with its
    neighbours' ints, would turn the chunk's whole column to float64 and exclude every
    sequence; each record is checked alone, in both JSONL parsers."""
    path = tmp_path / "x.jsonl"
    path.write_text(
        "\n".join(json.dumps(_record("response_ids", v)) for v in ([3, 4], [3.5, 4], [3, 4], ["3", 4], [3, 4])) + "\n"
    )
    for parser in ("auto", "python"):
        rep = audit(str(path), jsonl_parser=parser)
        assert rep["sequences"] == 3 and rep["excluded_by_kind"] == {"bad_type": 2}
        assert [i["line"] for i in rep["issues"]] == [2, 4]
        assert rep["issues"][1]["message"] == "response_ids[0] = '3' (values must be integers)"
