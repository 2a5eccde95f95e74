"""Fuzzing the audit with malformed files of every format ("every bad file a named
error"): random junk in random fields of JSONL, NPZ, Parquet and torch ``.pt`` files, dropped
columns, wrong lengths, broken offsets, truncated and byte-flipped files. Whatever the
file, ``detsample audit FILE --max-abs-diff 1e9`` must

* return (exit 0, 1 or 2) - an exception escaping ``main`` is the traceback a user would see;
* exit 2 only with one ``detsample audit: error:`` line naming the file;
* never pass the gate on excluded data: exit 0 means every sequence read was audited and
  at least one token was;
* name every exclusion: a documented kind, the file, a location and a field.

Bounded: a few dozen small files per format (the default suite runs it).
"""

from __future__ import annotations

import os
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

#: examples per fuzz test: a fixed, bounded set in the default suite; set
#: DETSAMPLE_FUZZ_EXAMPLES=2000 for a longer, randomised local run
FUZZ_EXAMPLES = int(os.environ.get("DETSAMPLE_FUZZ_EXAMPLES", 40))
FUZZ_FIXED = "DETSAMPLE_FUZZ_EXAMPLES" not in os.environ

from detsample.cli import main

KINDS = {"bad_json", "bad_type", "missing_column", "count_mismatch", "ragged", "nan",
         "non_finite", "positive_logprob", "bad_mask", "negative_token_id", "rescore_failed"}
COLUMNS = ("id", "prompt_ids", "response_ids", "engine_logprobs", "trainer_logprobs", "mask")

JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.text(max_size=3),
    st.floats(allow_nan=True, allow_infinity=True), st.just([]), st.just([[1, 2], [3]]),
    st.just({"a": 1}), st.lists(st.one_of(st.integers(-5, 2**64), st.floats(), st.none(),
                                          st.booleans(), st.text(max_size=2)), max_size=4))


def _good(k: int) -> dict:
    n = 1 + k % 3
    lp = [-0.25 * (j + 1) for j in range(n)]
    return {"id": f"s{k}", "prompt_ids": [1, 2], "response_ids": [3 + j for j in range(n)],
            "engine_logprobs": lp, "trainer_logprobs": list(lp), "mask": [1] * n}


@st.composite
def datasets(draw):
    """A few sequences, some of them spoilt: a field replaced by junk, shortened,
    lengthened or dropped."""
    recs = [_good(k) for k in range(draw(st.integers(1, 4)))]
    for _ in range(draw(st.integers(0, 3))):
        rec = recs[draw(st.integers(0, len(recs) - 1))]
        col = draw(st.sampled_from(COLUMNS))
        how = draw(st.sampled_from(["junk", "drop", "short", "long", "value"]))
        if how == "drop":
            rec.pop(col, None)
        elif how == "junk":
            rec[col] = draw(JUNK)
        elif isinstance(rec.get(col), list) and rec[col]:
            if how == "short":
                rec[col] = rec[col][:-1]
            elif how == "long":
                rec[col] = rec[col] + rec[col][:1]
            else:
                j = draw(st.integers(0, len(rec[col]) - 1))
                rec[col] = rec[col][:j] + [draw(JUNK)] + rec[col][j + 1:]
    return recs


def _json_default(x):
    return str(x)


def write_jsonl(recs, path, draw_bytes):
    lines = [json.dumps(r, default=_json_default) for r in recs]
    data = ("\n".join(lines) + "\n").encode()
    return _spoil_bytes(data, draw_bytes)


def _spoil_bytes(data: bytes, spoil) -> bytes:
    if spoil is None:
        return data
    kind, at, byte = spoil
    at = at % max(len(data), 1)
    if kind == "truncate":
        return data[:at]
    if kind == "flip":
        return data[:at] + bytes([byte]) + data[at + 1:]
    return data[:at] + bytes([byte]) * 3 + data[at:]  # insert


def _flat(values, dtype=None):
    try:
        a = np.asarray(values, dtype=dtype)
    except (ValueError, TypeError, OverflowError):
        a = np.asarray([str(v) for v in values])
    if a.dtype.kind == "O":
        a = np.asarray([str(v) for v in values])
    return a


def write_npz(recs, path, spoil):
    arrays = {"id": _flat([r.get("id", "") for r in recs])}
    for c in COLUMNS[1:]:
        rows = [r[c] if isinstance(r.get(c), list) else [] for r in recs]
        flat = [x for row in rows for x in (row if all(not isinstance(y, list) for y in row)
                                            else [])]
        arrays[c] = _flat(flat)
        arrays[f"{c}_offsets"] = np.cumsum([0] + [len(r) if all(not isinstance(y, list)
                                                                 for y in r) else 0
                                                  for r in rows])
    if spoil is not None and spoil[0] == "offsets":
        arrays["response_ids_offsets"] = arrays["response_ids_offsets"][::-1].copy()
    np.savez(path, **arrays)
    return None


def write_parquet(recs, path, spoil):
    cols = {}
    for c in COLUMNS:
        vals = [r.get(c) for r in recs]
        try:
            cols[c] = pa.array(vals)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            cols[c] = pa.array([None if v is None else str(v) for v in vals])
    pq.write_table(pa.table(cols), path)
    return None


def write_pt(recs, path, spoil, records=False):
    if records:
        torch.save(recs, path)
    else:
        torch.save({c: [r.get(c) for r in recs] for c in COLUMNS}, path)
    return None


SPOILS = st.one_of(st.none(), st.tuples(st.sampled_from(["truncate", "flip", "insert"]),
                                        st.integers(0, 10**6), st.integers(0, 255)))


def _run(path: str, tmp_path, capsys):
    out = tmp_path / "rep.json"
    out.unlink(missing_ok=True)
    rc = main(["audit", path, "--max-abs-diff", "1e9", "--quiet", "--json", str(out)])
    err = capsys.readouterr().err
    assert rc in (0, 1, 2)
    if rc == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("detsample audit: error: "), err
        assert path in lines[0] or "x." in lines[0], err
        return
    rep = json.loads(out.read_text())
    for it in rep["issues"]:
        assert it["kind"] in KINDS and it["source"] == path and it["field"], it
        assert ("line" in it) != ("row" in it) and it["message"], it
    if rc == 0:  # a passed gate: nothing excluded, something audited
        assert rep["excluded_sequences"] == 0 and rep["tokens"] > 0, rep["issues"]
    else:
        assert "GATE FAILED" in err
        assert rep["excluded_sequences"] > 0 or rep["tokens"] == 0 or \
            not rep["max_abs_diff"] <= 1e9


_SETTINGS = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=FUZZ_FIXED,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])


@_SETTINGS
@given(recs=datasets(), spoil=SPOILS)
def test_jsonl(tmp_path, capsys, recs, spoil):
    path = tmp_path / "x.jsonl"
    path.write_bytes(write_jsonl(recs, path, spoil))
    _run(str(path), tmp_path, capsys)


@_SETTINGS
@given(recs=datasets(), spoil=st.one_of(st.none(), st.just(("offsets", 0, 0)), SPOILS))
def test_npz(tmp_path, capsys, recs, spoil):
    path = tmp_path / "x.npz"
    write_npz(recs, path, spoil)
    if spoil is not None and spoil[0] != "offsets":
        path.write_bytes(_spoil_bytes(path.read_bytes(), spoil))
    _run(str(path), tmp_path, capsys)


@_SETTINGS
@given(recs=datasets(), spoil=SPOILS)
def test_parquet(tmp_path, capsys, recs, spoil):
    path = tmp_path / "x.parquet"
    write_parquet(recs, path, spoil)
    if spoil is not None:
        path.write_bytes(_spoil_bytes(path.read_bytes(), spoil))
    _run(str(path), tmp_path, capsys)


@_SETTINGS
@given(recs=datasets(), spoil=SPOILS, records=st.booleans())
def test_torch(tmp_path, capsys, recs, spoil, records):
    path = tmp_path / "x.pt"
    recs = [{k: (v if not (isinstance(v, float) and math.isnan(v)) else v) for k, v in r.items()}
            for r in recs]
    write_pt(recs, path, spoil, records)
    if spoil is not None:
        path.write_bytes(_spoil_bytes(path.read_bytes(), spoil))
    _run(str(path), tmp_path, capsys)


@pytest.mark.parametrize("fmt", ["jsonl", "npz", "parquet", "pt"])
def test_a_clean_file_passes_the_gate(tmp_path, capsys, fmt):
    """The fuzz's control: the unspoilt data passes (so a pass is possible at all)."""
    recs = [_good(k) for k in range(3)]
    path = tmp_path / f"x.{fmt}"
    if fmt == "jsonl":
        path.write_bytes(write_jsonl(recs, path, None))
    else:
        {"npz": write_npz, "parquet": write_parquet, "pt": write_pt}[fmt](recs, path, None)
    assert main(["audit", str(path), "--max-abs-diff", "0", "--quiet"]) == 0
