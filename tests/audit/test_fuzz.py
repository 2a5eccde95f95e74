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

import json
import math
import os

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

KINDS = {
    "bad_json",
    "bad_type",
    "missing_column",
    "count_mismatch",
    "ragged",
    "nan",
    "non_finite",
    "positive_logprob",
    "bad_mask",
    "negative_token_id",
    "rescore_failed",
}
COLUMNS = ("id", "prompt_ids", "response_ids", "engine_logprobs", "trainer_logprobs", "mask")

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.text(max_size=3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.just([]),
    st.just([[1, 2], [3]]),
    st.just({"a": 1}),
    st.lists(st.one_of(st.integers(-5, 2**64), st.floats(), st.none(), st.booleans(), st.text(max_size=2)), max_size=4),
)


def _good(k: int) -> dict:
    n = 1 + k % 3
    lp = [-0.25 * (j + 1) for j in range(n)]
    return {
        "id": f"s{k}",
        "prompt_ids": [1, 2],
        "response_ids": [3 + j for j in range(n)],
        "engine_logprobs": lp,
        "trainer_logprobs": list(lp),
        "mask": [1] * n,
    }


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
                rec[col] = rec[col][:j] + [draw(JUNK)] + rec[col][j + 1 :]
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
        return data[:at] + bytes([byte]) + data[at + 1 :]
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
        flat = [x for row in rows for x in (row if all(not isinstance(y, list) for y in row) else [])]
        arrays[c] = _flat(flat)
        arrays[f"{c}_offsets"] = np.cumsum(
            [0] + [len(r) if all(not isinstance(y, list) for y in r) else 0 for r in rows]
        )
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


SPOILS = st.one_of(
    st.none(), st.tuples(st.sampled_from(["truncate", "flip", "insert"]), st.integers(0, 10**6), st.integers(0, 255))
)


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
        assert rep["excluded_sequences"] > 0 or rep["tokens"] == 0 or not rep["max_abs_diff"] <= 1e9


_SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=FUZZ_FIXED,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


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
    recs = [{k: (v if not (isinstance(v, float) and math.isnan(v)) else v) for k, v in r.items()} for r in recs]
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


# --------------------------------------------------------------------------- input classes
# Bugs pinned: JSON nested 100,000 levels deep raised RecursionError out of the audit (also
# --preset openai) and audit-log; .pt files holding sparse, meta, float8, quantized or
# nested tensors raised from to_numpy; a .pt holding a list of numbers was "expected a JSON
# object"; audit-log passed its gates on max_abs_diff -1 or "-inf", an exact-match
# fraction 2.0, negative counts, and raised on "abc"; an OpenAI response with
# usage.prompt_tokens -2 (or true) moved a prompt token into the response and passed.


def _nested(depth: int, opener: str) -> str:
    closer = "]" if opener == "[" else "}"
    return opener * depth + "1" + closer * depth


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    depth=st.integers(1, 100_000),
    opener=st.sampled_from(["[", '{"a":']),
    where=st.sampled_from(["line", "field"]),
    preset=st.sampled_from([None, "openai"]),
)
def test_any_nesting_depth_is_read_or_named(tmp_path, capsys, depth, opener, where, preset):
    deep = _nested(depth, opener)
    good = json.dumps(_good(0))
    line = deep if where == "line" else good[:-1] + f', "response_ids": {deep}}}'
    path = tmp_path / "x.jsonl"
    path.write_text(good + "\n" + line + "\n")
    args = ["--preset", preset] if preset else []
    if preset:
        _run_preset(str(path), args, capsys)
    else:
        _run(str(path), tmp_path, capsys)


def _run_preset(path, args, capsys):
    rc = main(["audit", path, "--quiet", *args])
    err = capsys.readouterr().err
    assert rc in (0, 1, 2), err
    assert rc != 1 or "GATE FAILED" in err, err  # no token audited is a failed gate
    if rc == 2:
        assert err.startswith("detsample audit: error: ") and err.count("\n") == 1, err


def _sparse():
    return torch.tensor([[-1.0, 0.0], [0.0, -2.0]]).to_sparse()


def _quantized():
    return torch.quantize_per_tensor(torch.zeros(2, 2), 0.1, 0, torch.qint8)


def _nested_tensor():
    return torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])


#: tensors the audit cannot read as values, and the words naming them
TENSOR_KINDS = [
    (_sparse, "a sparse_coo tensor"),
    (lambda: torch.tensor([[-1.0, 0.0], [0.0, -2.0]]).to_sparse_csr(), "a sparse_csr tensor"),
    (lambda: torch.empty(2, 2, device="meta"), "a meta tensor"),
    (lambda: torch.zeros(2, 2, dtype=torch.float8_e4m3fn), "dtype torch.float8_e4m3fn"),
    (lambda: torch.zeros(2, 2, dtype=torch.complex64), "dtype torch.complex64"),
    (_quantized, "a quantized tensor"),
    (_nested_tensor, "a nested tensor"),
]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("make,words", TENSOR_KINDS, ids=[w for _, w in TENSOR_KINDS])
@pytest.mark.parametrize("records", [False, True], ids=["columns", "records"])
def test_unreadable_tensor_kinds_are_named(tmp_path, capsys, make, words, records):
    t = make()
    cols = {
        "id": ["a", "b"],
        "prompt_ids": torch.tensor([[1], [2]]),
        "response_ids": torch.tensor([[3, 4], [5, 6]]),
        "engine_logprobs": t,
        "trainer_logprobs": torch.full((2, 2), -0.5),
    }
    obj = [{"id": "a", "prompt_ids": [1], "response_ids": [3, 4], "engine_logprobs": t}] if records else cols
    path = tmp_path / "x.pt"
    torch.save(obj, path)
    rc = main(["audit", str(path), "--quiet", "--max-abs-diff", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert str(path) in err and "'engine_logprobs'" in err and words in err, err


@pytest.mark.parametrize(
    "obj,words", [([1, 2, 3], "a list of int"), (["a", 1.5], "a list of float, str"), (torch.zeros(3), "got Tensor")]
)
def test_a_pt_file_of_another_shape_is_named(tmp_path, capsys, obj, words):
    path = tmp_path / "x.pt"
    torch.save(obj, path)
    assert main(["audit", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and words in err, err


LOG_ROW = {
    "step": 3,
    "sequences": 2,
    "excluded_sequences": 0,
    "tokens": 4,
    "exact_match_fraction": 1.0,
    "mismatch_fraction": 0.0,
    "mean_abs_diff": 0.0,
    "max_abs_diff": 0.0,
    "k3_kl_mean": 0.0,
    "abs_diff_p99": 0.0,
    "ratio": {"mean": 1.0, "min": 1.0, "max": 1.0, "p50": 1.0},
}
_LOG_COUNTS = ("step", "sequences", "excluded_sequences", "tokens")
_LOG_FRACTIONS = ("exact_match_fraction", "mismatch_fraction")


def _log_value_ok(key: str, v) -> bool:
    """The documented rule (docs/audit.md), written out independently of the reader."""
    if key in _LOG_COUNTS:
        return type(v) is int and v >= 0
    if v is None:
        return True
    if isinstance(v, str):
        return v == "inf" and key not in _LOG_FRACTIONS
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        return False
    return 0 <= v <= (1 if key in _LOG_FRACTIONS else math.inf)


def _metric(v) -> float | None:
    return None if v is None else float(v)


def _log_row_contradicts(row: dict) -> bool:
    """The documented consistency rules (docs/audit.md), written out independently: tokens
    need sequences, no token means null metrics, exact + mismatch <= 1, max |d| > 0 exactly
    when the mismatch fraction is, max |d| bounds mean |d| and p99."""
    m = {
        k: _metric(row[k])
        for k in (
            "exact_match_fraction",
            "mismatch_fraction",
            "mean_abs_diff",
            "max_abs_diff",
            "k3_kl_mean",
            "abs_diff_p99",
        )
    }
    if row["tokens"] == 0:
        return any(v is not None for v in m.values())
    if row["sequences"] == 0:
        return True
    e, mis, top = m["exact_match_fraction"], m["mismatch_fraction"], m["max_abs_diff"]
    if None not in (e, mis) and e + mis > 1 + 1e-9:
        return True
    if None not in (top, mis) and (top > 0) != (mis > 0):
        return True
    return top is not None and any(m[k] is not None and m[k] > top for k in ("mean_abs_diff", "abs_diff_p99"))


LOG_JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["abc", "inf", "-inf", "nan", "", "1"]),
    st.just([1]),
    st.just({"a": 1}),
)


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=FUZZ_FIXED,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    key=st.sampled_from(
        _LOG_COUNTS + _LOG_FRACTIONS + ("mean_abs_diff", "max_abs_diff", "k3_kl_mean", "abs_diff_p99", "ratio.p50")
    ),
    value=LOG_JUNK,
)
def test_audit_log_values_follow_the_value_rule(tmp_path, capsys, key, value):
    row = json.loads(json.dumps(LOG_ROW))
    if key.startswith("ratio."):
        row["ratio"][key[6:]] = value
    else:
        row[key] = value
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps(row) + "\n")
    rc = main(
        [
            "audit-log",
            str(path),
            "--quiet",
            "--max-abs-diff",
            "1e9",
            "--min-exact-match",
            "0",
            "--max-k3",
            "1e9",
            "--max-mismatch",
            "1",
        ]
    )
    err = capsys.readouterr().err
    if _log_value_ok(key.removeprefix("ratio."), value):
        if _log_row_contradicts(row):  # each value valid, the row impossible
            assert rc == 2 and err.count("\n") == 1 and f"{path}:line 1: " in err, err
            return
        assert rc in (0, 1), err  # read; a null metric under its gate fails (exit 1)
        return
    assert rc == 2 and err.count("\n") == 1, err
    assert f"{path}:line 1: {key}" in err, err


PROMPT_TOKENS = [(-2, False), (True, False), (False, False), ("3", False), (2.0, False), (None, False), (3, True)]


@pytest.mark.parametrize("value,reads", PROMPT_TOKENS, ids=[repr(v) for v, _ in PROMPT_TOKENS])
def test_usage_prompt_tokens_is_a_count(tmp_path, value, reads):
    from detsample.audit import audit

    toks = [f"token_id:{t}" for t in (1, 2, 3, 7, 8)]
    line = {
        "id": "e",
        "choices": [{"index": 0, "logprobs": {"tokens": toks, "token_logprobs": [None, -0.5, -0.5, -0.5, -0.25]}}],
        "usage": {"prompt_tokens": value},
        "trainer_logprobs": [-0.5, -0.25],
    }
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(line) + "\n")
    rep = audit(str(path), preset="openai")
    if reads:
        assert rep["sequences"] == 1 and rep["tokens"] == 2 and rep["excluded_sequences"] == 0
        return
    assert rep["sequences"] == 0 and rep["excluded_sequences"] == 1, rep
    issue = rep["issues"][0]
    assert issue["field"] == "usage.prompt_tokens" and repr(value)[:3] in issue["message"], issue


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_negative_count_gets_the_same_verdict_in_every_format(tmp_path, fmt):
    """Bug pinned: a negative response_length in Parquet read as an absent column
    ("missing column 'response_length'") where JSONL named the value."""
    from detsample.audit import audit

    rows = [
        {
            "id": k,
            "input_ids": [1, 2, 3, 4],
            "response_length": n,
            "engine_logprobs": [-0.5, -0.25],
            "trainer_logprobs": [-0.5, -0.25],
        }
        for k, n in ((0, -2), (1, 2))
    ]
    path = tmp_path / f"x.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    rep = audit(str(path), columns="input_ids=input_ids,response_length=response_length")
    issue = rep["issues"][0]
    assert rep["sequences"] == 1 and rep["excluded_sequences"] == 1, rep["issues"]
    assert (issue["field"], issue["kind"], issue["message"]) == (
        "response_length",
        "bad_type",
        "must be >= 0, got -2",
    ), issue


def test_an_unreadable_tensor_inside_a_list_of_numbers_is_found(tmp_path, capsys):
    """The walk's fast path (lists of plain values are not entered) still enters a list
    that holds a tensor among numbers."""
    rec = {"id": "a", "prompt_ids": [1], "response_ids": [3, 4], "engine_logprobs": [-0.5, _sparse()]}
    path = tmp_path / "x.pt"
    torch.save([_good(0), rec], path)
    assert main(["audit", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "[1]['engine_logprobs'][1]: a sparse_coo tensor" in err, err
