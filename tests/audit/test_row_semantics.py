"""Per-row logprob semantics: the columns ``logprobs_mode``, ``temperature``, ``top_k``,
``top_p`` and ``min_p`` override the rescoring's file-wide semantics for their row, in
every format; a bad value excludes only its row, named (detsample/audit/running/validate.py,
detsample/audit/semantics.py ``Semantics.with_row``).

The check is bitwise and end to end: each row's engine logprobs are what a file-wide
rescorer in that row's semantics computes, so the audit matches them exactly (exact
match 1.0, max |d| 0) only if the row's own semantics were used; without the columns it
does not."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.audit import audit
from detsample.audit.running.rescore import ModelRescorer
from detsample.audit.semantics import RAW, Semantics

PROMPTS = [[3, 17, 40], [7, 8], [1, 2, 3, 4], [11]]
LENGTHS = [4, 3, 2, 5]


def _greedy(prompt: list, n: int) -> list:
    """n greedy tokens after ``prompt``: the argmax is in every kept set (any top-k,
    top-p, min-p), so its processed logprob is finite in every semantics."""
    model, out = ModelRescorer("refmodel"), []
    for _ in range(n):
        out.append(int(model.logits(prompt, out + [0])[-1].argmax()))
    return out


PAIRS = [(p, _greedy(p, n)) for p, n in zip(PROMPTS, LENGTHS)]
#: (stated columns of a row, or {} for none), one per pair
STATED = [
    {"logprobs_mode": "processed", "temperature": 0.7, "top_p": 0.9},
    {"temperature": 0.5, "top_k": 5},
    {},
    {"logprobs_mode": "processed_logprobs", "min_p": 0.05, "top_k": -1},
]
FILE_WIDE = Semantics("processed", temperature=1.3, top_p=0.8)


def _engine(base: Semantics, stated: dict, prompt: list, response: list) -> list[float]:
    """What a file-wide rescorer in the row's semantics computes (float32 values)."""
    return ModelRescorer("refmodel", semantics=base.with_row(**stated))(prompt, response).tolist()


@pytest.fixture(scope="module")
def records() -> list[dict]:
    out = []
    for i, ((p, r), s) in enumerate(zip(PAIRS, STATED)):
        out.append(
            {"id": f"s{i}", "prompt_ids": p, "response_ids": r, "engine_logprobs": _engine(FILE_WIDE, s, p, r), **s}
        )
    return out


def _exact(report: dict) -> tuple[float, float, int]:
    return report["exact_match_fraction"], report["max_abs_diff"], report["excluded_sequences"]


def _columns(records: list[dict], padded: bool) -> dict:
    """Column arrays of the records: ragged (flat + offsets) or padded 2-D (with a prompt
    attention mask and a loss mask), the stated values as 1-D columns (NaN / "" never stand for 'not stated': every
    row states every column here, the file-wide value where the record has none)."""
    cols: dict = {"id": np.array([r["id"] for r in records])}
    for c in ("prompt_ids", "response_ids", "engine_logprobs"):
        rows = [np.asarray(r[c], dtype=np.float64 if "logprobs" in c else np.int64) for r in records]
        if padded:  # the prompt left-padded, the response right-padded
            w = max(len(x) for x in rows)
            side = (1, 0) if c == "prompt_ids" else (0, 1)
            cols[c] = np.stack([np.pad(x, (side[0] * (w - len(x)), side[1] * (w - len(x)))) for x in rows])
            if c == "prompt_ids":
                cols["prompt_attention_mask"] = (
                    cols[c] * 0 + np.stack([np.arange(w) >= w - len(x) for x in rows])
                ).astype(np.int64)
            if c == "response_ids":
                cols["mask"] = np.stack([np.arange(w) < len(x) for x in rows]).astype(np.int64)
        else:
            cols[c] = np.concatenate(rows)
            cols[f"{c}_offsets"] = np.cumsum([0] + [len(x) for x in rows])
    full = [FILE_WIDE.with_row(**{k: v for k, v in r.items() if k in STATED_KEYS}) for r in records]
    cols["logprobs_mode"] = np.array([s.logprobs_mode for s in full])
    for c in ("temperature", "top_p", "min_p"):
        cols[c] = np.array([getattr(s, c) for s in full], dtype=np.float64)
    cols["top_k"] = np.array([s.top_k for s in full], dtype=np.int64)
    return cols


STATED_KEYS = ("logprobs_mode", "temperature", "top_k", "top_p", "min_p")


def _write(fmt: str, records: list[dict], path) -> str:
    import torch

    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif fmt.startswith("npz"):
        np.savez(path, **_columns(records, padded=fmt == "npz-padded"))
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(
            pa.table(
                {
                    k: [r.get(k) for r in records]
                    for k in ("id", "prompt_ids", "response_ids", "engine_logprobs", *STATED_KEYS)
                }
            ),
            path,
        )
    elif fmt == "pt-records":
        torch.save([{k: (torch.tensor(v) if isinstance(v, list) else v) for k, v in r.items()} for r in records], path)
    else:  # pt-columns: padded tensors, the stated values 1-D tensors (the mode a list)
        cols = _columns(records, padded=True)
        torch.save({k: (v.tolist() if v.dtype.kind in "US" else torch.from_numpy(v)) for k, v in cols.items()}, path)
    return str(path)


FORMATS = {
    "jsonl": "r.jsonl",
    "npz": "r.npz",
    "npz-padded": "r.npz",
    "parquet": "r.parquet",
    "pt-records": "r.pt",
    "pt-columns": "r.pt",
}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format_rescores_each_row_in_its_stated_semantics(records, tmp_path, fmt):
    """Pins per-row semantics in every format (ragged and padded): rescored in the row's
    own semantics, bitwise; the same file without the columns does not match."""
    path = _write(fmt, records, tmp_path / FORMATS[fmt])
    rescorer = ModelRescorer("refmodel", semantics=FILE_WIDE)
    assert _exact(audit(path, rescore=rescorer)) == (1.0, 0.0, 0)


def test_without_the_columns_the_file_wide_semantics_apply(records):
    """The control: the same engine logprobs rescored file-wide do not match (so the test
    above can fail)."""
    bare = [{k: v for k, v in r.items() if k not in STATED_KEYS} for r in records]
    frac, worst, _ = _exact(audit(bare, rescore=ModelRescorer("refmodel", semantics=FILE_WIDE)))
    assert frac < 1.0 and worst > 1e-3


def test_a_row_overrides_only_the_fields_it_states(records):
    """Pins precedence, field by field: row 1 states temperature 0.5 and top_k 5 and keeps
    the file's processed mode and top_p 0.8."""
    s = FILE_WIDE.with_row(**STATED[1])
    assert s == Semantics("processed", temperature=0.5, top_k=5, top_p=0.8)
    assert RAW.with_row(temperature=0.7) == RAW  # raw logprobs: the temperature changes nothing
    p, r = PAIRS[1]
    assert records[1]["engine_logprobs"] == ModelRescorer("refmodel", semantics=s)(p, r).tolist()


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("top_p", 1.5, "top_p must be in (0, 1], got 1.5"),
        ("temperature", -1, "temperature must be >= 0, got -1.0"),
        ("top_k", 2.5, "top_k must be an integer, got 2.5"),
        ("logprobs_mode", "logits", "logprobs_mode must be one of"),
        ("min_p", "0.1", "min_p must be a real number, got '0.1'"),
        # values of the wrong kind were a TypeError (unhashable) traceback, not an exclusion
        ("temperature", [0.7], "temperature must be a number, got list [0.7]"),
        ("top_p", {"p": 0.9}, "top_p must be a number, got dict"),
    ],
)
def test_a_bad_value_excludes_only_its_row_named(records, tmp_path, field, value, message):
    """Pins bad per-row values: the project's per-row error (file, line, field, value),
    the row excluded (kind bad_semantics), the others audited."""
    recs = [dict(r) for r in records]
    recs[2][field] = value
    path = _write("jsonl", recs, tmp_path / "bad.jsonl")
    rep = audit(path, rescore=ModelRescorer("refmodel", semantics=FILE_WIDE))
    assert rep["excluded_by_kind"] == {"bad_semantics": 1}
    issue = rep["issues"][0]
    assert (issue["line"], issue["field"]) == (3, field) and message in issue["message"]
    assert _exact(rep)[:2] == (1.0, 0.0) and rep["sequences"] == 3


def test_a_plain_callable_cannot_follow_stated_semantics(records):
    """A rescore callable without semantics: rows stating processed logprobs (rows 0 and
    3) are excluded, named (never rescored as raw silently); rows whose stated semantics
    are raw (row 1: a temperature and top-k beside the default raw mode) and unstated
    rows are rescored."""
    model = ModelRescorer("refmodel")
    rep = audit(records, rescore=lambda p, r: model(p, r))
    assert rep["excluded_by_kind"] == {"rescore_failed": 2}
    assert [i["row"] for i in rep["issues"]] == [0, 3]
    assert "takes no logprob semantics" in rep["issues"][0]["message"]


MODES = st.sampled_from([None, "raw", "scaled", "processed", "processed_fixed"])


@settings(max_examples=6, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "logprobs_mode": MODES,
                "temperature": st.sampled_from([0.0, 0.5, 0.7, 1.0, 1.3]),
                "top_k": st.sampled_from([-1, 1, 3, 50]),
                "top_p": st.sampled_from([0.5, 0.9, 1.0]),
                "min_p": st.sampled_from([0.0, 0.05, 0.3]),
            },
        ),
        min_size=len(PAIRS),
        max_size=len(PAIRS),
    ),
    st.sampled_from([RAW, FILE_WIDE, Semantics("scaled", temperature=0.6)]),
)
def test_any_mix_of_row_semantics_rescores_as_file_wide_runs(stated, base):
    """Pins per-row semantics as a property: any mix of stated fields over any file-wide
    semantics gives, row by row, the logprobs of a file-wide run in that row's semantics
    (bitwise: exact match 1.0 and max |d| 0 against them)."""
    stated = [{k: v for k, v in s.items() if v is not None} for s in stated]
    recs = [
        {"id": str(i), "prompt_ids": p, "response_ids": r, "engine_logprobs": _engine(base, s, p, r), **s}
        for i, ((p, r), s) in enumerate(zip(PAIRS, stated))
    ]
    assert _exact(audit(recs, rescore=ModelRescorer("refmodel", semantics=base))) == (1.0, 0.0, 0)


def test_both_jsonl_parsers_read_the_same_stated_values(records, tmp_path):
    """Pins the JSONL fast path (pyarrow) against the line-by-line one on stated values:
    integers among floats (1 and 0.7), a bad value in a typed column and a top_k that
    pyarrow would widen to a float give the same report."""
    from detsample.audit import to_json

    rescorer = ModelRescorer("refmodel", semantics=FILE_WIDE)
    for k, top_k in enumerate((50, 2.5)):  # a block pyarrow reads, and one it hands back
        recs = [dict(r) for r in records]
        recs[0]["temperature"], recs[1]["temperature"], recs[2]["top_k"] = 1, -1, top_k
        path = _write("jsonl", recs, tmp_path / f"r{k}.jsonl")
        fast, slow = (to_json(audit(path, rescore=rescorer, jsonl_parser=p)) for p in ("auto", "python"))
        assert fast == slow and '"temperature must be >= 0, got -1.0"' in fast


def test_a_logged_openai_request_states_the_semantics(tmp_path):
    """Pins --preset openai: the request of a {"request", "response"} log line states the
    choices' semantics (vLLM's temperature / top_p / top_k, top_k 0 = no top-k)."""
    (p, r), s = PAIRS[0], {"logprobs_mode": "processed", "temperature": 0.7, "top_p": 0.9}
    lps = _engine(RAW, s, p, r)
    line = {
        "request": {"model": "m", "temperature": 0.7, "top_p": 0.9, "top_k": 0},
        "response": {
            "id": "c1",
            "object": "chat.completion",
            "prompt_token_ids": p,
            "choices": [
                {
                    "index": 0,
                    "token_ids": r,
                    "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": v} for t, v in zip(r, lps)]},
                }
            ],
        },
    }
    path = tmp_path / "o.jsonl"
    path.write_text(json.dumps(line) + "\n")
    rep = audit(str(path), preset="openai", rescore=ModelRescorer("refmodel", semantics=Semantics("processed")))
    assert _exact(rep) == (1.0, 0.0, 0)
