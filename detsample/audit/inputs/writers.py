"""The audit's own columns written to disk: a column-major rollout set as JSONL, NPZ or
Parquet (what ``detsample rollout`` writes, and what the audit reads back unchanged).

A rollout set is column-major: ``{"id": [S] str, C: (values [T_C], offsets [S+1])}`` for
C in prompt_ids, response_ids, engine_logprobs, trainer_logprobs, mask; and optionally
the per-sequence integer columns of :data:`ROW_COLUMNS` (``group``: the prompt's index of
a rollout with n samples per prompt; ``seed``), ``[S]`` int64 each.
"""

from __future__ import annotations

import json

import numpy as np

from detsample.audit.inputs.layout import LIST_COLUMNS
from detsample.audit.inputs.table import offsets_from_lengths
from detsample.outputs import write_file

#: per-sequence integer columns a rollout set may carry (the audit reads them as data)
ROW_COLUMNS = ("group", "seed")


def from_records(records: list[dict]) -> dict:
    """Column-major rollout set from records (the inverse of :func:`to_records`); the
    float columns keep float64 unless every value is a float32 array."""
    cols: dict = {"id": [str(r["id"]) for r in records]}
    for c in LIST_COLUMNS:
        if not all(c in r for r in records):
            continue
        parts = [np.asarray(r[c]) for r in records]
        off = offsets_from_lengths(np.array([p.size for p in parts], dtype=np.int64))
        dtype = np.int64 if c.endswith("_ids") or c == "mask" else np.float64
        if dtype is np.float64 and parts and all(p.dtype == np.float32 for p in parts):
            dtype = np.float32
        vals = np.concatenate(parts).astype(dtype) if parts else np.empty(0, dtype=dtype)
        cols[c] = (vals, off)
    for c in ROW_COLUMNS:
        if records and all(c in r for r in records):
            cols[c] = np.asarray([int(r[c]) for r in records], dtype=np.int64)
    return cols


def to_records(cols: dict) -> list[dict]:
    """Row-major records (lists of Python numbers) of a rollout set."""
    out = []
    for i, rid in enumerate(cols["id"]):
        rec: dict = {"id": rid}
        for c in LIST_COLUMNS:
            if c in cols:
                v, o = cols[c]
                rec[c] = v[o[i] : o[i + 1]].tolist()
        for c in ROW_COLUMNS:
            if c in cols:
                rec[c] = int(cols[c][i])
        out.append(rec)
    return out


def write_jsonl(cols: dict, path: str, flag: str = "output") -> None:
    """``cols`` as JSON lines at exactly ``path``, atomically (a failure leaves the old file)."""
    write_file(path, "".join(json.dumps(rec) + "\n" for rec in to_records(cols)), flag)


def write_npz(cols: dict, path: str, compressed: bool = False, flag: str = "output") -> None:
    """``cols`` as an NPZ at exactly ``path`` (numpy appends ``.npz`` to a name only when
    it is given a name, so it is given a file), atomically."""
    arrays = {"id": np.asarray(cols["id"])}
    for c in LIST_COLUMNS:
        if c in cols:
            arrays[c], arrays[f"{c}_offsets"] = cols[c]
    arrays.update({c: cols[c] for c in ROW_COLUMNS if c in cols})
    save = np.savez_compressed if compressed else np.savez
    write_file(path, lambda fh: save(fh, **arrays), flag)


def write_parquet(cols: dict, path: str, row_group_size: int = 1024, flag: str = "output") -> None:
    """``cols`` as Parquet at exactly ``path``, atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = {"id": pa.array(cols["id"], type=pa.string())}
    for c in LIST_COLUMNS:
        if c in cols:
            v, o = cols[c]
            data[c] = pa.ListArray.from_arrays(pa.array(o.astype(np.int32)), pa.array(v))
    data.update({c: pa.array(cols[c], type=pa.int64()) for c in ROW_COLUMNS if c in cols})
    table = pa.table(data)
    write_file(path, lambda fh: pq.write_table(table, fh, row_group_size=row_group_size), flag)


# --------------------------------------------------------------------------- padded twins
