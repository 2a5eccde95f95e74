"""Padded rows and their ragged twins: same validation, same report byte for byte; layout
contradictions are fatal and named (detsample/audit/inputs/assemble.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from detsample.audit import AuditInputError, audit, to_json
from tests.audit.synth import padded_twin, slime_samples, synth_rollouts, to_records, write_columns, write_npz

FORMATS = ["npz", "parquet", "pt"]
# (layout in padded_twin, audit keywords, response side, prompt side)
TWINS = [
    ("default", {}, "right", "left"),
    ("default", {}, "left", "right"),
    ("default", {"padding": "left"}, "left", "left"),
    ("verl", {"preset": "verl"}, "right", "left"),
    ("trl", {"preset": "trl"}, "right", "left"),
    ("openrlhf", {"preset": "openrlhf"}, "right", "left"),
]


def _rollouts(seed: int, n: int = 40, **kw) -> dict:
    """Synthetic rollouts whose ids are row numbers (as frameworks without ids report)
    and whose responses start with a trained token (so OpenRLHF can find the prompt)."""
    cols = synth_rollouts(n, seed=seed, **kw)
    cols["id"] = [str(i) for i in range(n)]
    m, off = cols["mask"]
    m = m.copy()
    starts = off[:-1][np.diff(off) > 0]
    m[starts] = 1
    cols["mask"] = (m, off)
    return cols


def _audit_in(directory, name: str, **kw) -> str:
    """The JSON report of ``directory/name`` audited under its bare name (so the reports
    of twins in two directories can be compared byte for byte)."""
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        return to_json(audit(name, **kw))
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def ragged(tmp_path_factory):
    cols = _rollouts(seed=3, mismatch_rate=0.4)
    d = tmp_path_factory.mktemp("ragged")
    reports = {}
    for fmt in FORMATS:
        name = f"r.{fmt}"
        if fmt == "npz":
            write_npz(cols, str(d / name))
        elif fmt == "pt":  # ragged .pt: one list of 1-D tensors per column
            import torch

            torch.save(
                {
                    k: (list(v) if k == "id" else [torch.from_numpy(v[0][v[1][i] : v[1][i + 1]]) for i in range(40)])
                    for k, v in cols.items()
                },
                d / name,
            )
        else:
            from tests.audit.synth import write_parquet

            write_parquet(cols, str(d / name))
        reports[fmt] = _audit_in(d, name)
    return cols, reports


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout,kwargs,side,prompt_side", TWINS)
def test_padded_file_and_ragged_twin_give_byte_equal_reports(ragged, tmp_path, fmt, layout, kwargs, side, prompt_side):
    """Pins padded input: a padded file (junk, NaN and positive logprobs in its padding)
    and its ragged twin give the same JSON report, byte for byte."""
    cols, reports = ragged
    arrays = padded_twin(cols, layout, response_side=side, prompt_side=prompt_side, seed=7)
    write_columns(arrays, str(tmp_path / f"r.{fmt}"))
    assert _audit_in(tmp_path, f"r.{fmt}", chunk_tokens=300, **kwargs) == reports[fmt]


def test_slime_records_give_the_ragged_report(ragged, tmp_path):
    """Pins the input_ids + response_length split (slime): prompt = all but the last
    response_length tokens."""
    import torch

    cols, reports = ragged
    torch.save({"format_version": 2, "samples": slime_samples(cols)}, tmp_path / "r.pt")
    assert _audit_in(tmp_path, "r.pt", preset="slime") == reports["pt"]  # ids: the index


@settings(max_examples=20, deadline=None)
@given(
    st.integers(1, 30),
    st.integers(0, 2**16),
    st.sampled_from(["left", "right"]),
    st.integers(0, 5),
    st.integers(1, 400),
)
@example(1, 23, "left", 0, 10)  # one empty response, no extra padding: a width-0 column
@example(1, 23, "right", 0, 10)
def test_any_padding_gives_the_ragged_report(n, seed, side, extra, chunk_tokens):
    """Pins padding invariance: any batch, padding side, pad width and chunk size --
    a width-0 padded column included (numpy's argmax once raised on its empty rows)."""
    cols = _rollouts(seed=seed, n=n, mean_len=6, prompt_len=3, mismatch_rate=0.5)
    recs = to_records(cols)
    want = to_json(audit(recs))
    arrays = padded_twin(cols, "default", response_side=side, prompt_side=side, extra=extra, seed=seed)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        write_columns(arrays, os.path.join(d, "r.npz"))
        got = audit(os.path.join(d, "r.npz"), chunk_tokens=chunk_tokens)
    got["sources"] = ["<records>"]
    for it in got["worst_sequences"]:
        it["source"] = "<records>"
    assert to_json(got) == want


def _verl_arrays() -> dict:
    cols = _rollouts(seed=6, n=6, mean_len=5, prompt_len=3)
    assert np.diff(cols["response_ids"][1])[2] >= 3
    return padded_twin(cols, "verl", seed=2)


def _set(arrays: dict, key: str, row: int, col: int, value) -> dict:
    arrays[key] = arrays[key].copy()
    arrays[key][row, col] = value
    return arrays


def _mask_on_padding(a: dict) -> dict:
    resp_len = a["attention_mask"][0, a["prompts"].shape[1] :].sum()
    return _set(a, "response_mask", 0, int(resp_len), 1)


def _both_sides(a: dict) -> dict:
    p = a["prompts"].shape[1]
    att = a["attention_mask"].copy()
    row = att[1, p:].copy()
    att[1, p:] = row[::-1]  # row 1 now left-padded, the others right-padded
    a["attention_mask"] = att
    return a


def _hole(a: dict) -> dict:
    p = a["prompts"].shape[1]
    assert a["attention_mask"][2, p:].sum() >= 3  # a real token on both sides of the hole
    return _set(a, "attention_mask", 2, p + 1, 0)


CONTRADICTIONS = [
    # (name, change, text in the error)
    ("mask-on-padding", _mask_on_padding, "row 0: column 'response_mask' (mask, preset verl): is 1 at position"),
    (
        "both-sides",
        _both_sides,
        "row 1: column 'attention_mask' (attention_mask, preset verl): not padded on the right",
    ),
    ("hole", _hole, "row 2: column 'attention_mask' (attention_mask, preset verl): its 1s are not one contiguous run"),
    ("not-01", lambda a: _set(a, "attention_mask", 3, 0, 2), "padding masks hold 0/1, got 2"),
    (
        "middle",
        lambda a: _set(a, "attention_mask", 2, a["prompts"].shape[1], 0),
        "row 2: column 'attention_mask' (attention_mask, preset verl): padded on both sides",
    ),
    (
        "mask-shape",
        lambda a: {**a, "response_mask": a["response_mask"][:, :-1]},
        "column 'response_mask' (mask, preset verl): shape",
    ),
    ("attention-width", lambda a: {**a, "attention_mask": a["attention_mask"][:, 1:]}, "expected width"),
    ("engine-1d", lambda a: {**a, "rollout_log_probs": a["rollout_log_probs"][:, 0]}, "rollout_log_probs"),
]


@pytest.mark.parametrize("fmt", ["npz", "pt"])
@pytest.mark.parametrize("name,change,text", CONTRADICTIONS)
def test_layout_contradictions_are_fatal_and_named(tmp_path, fmt, name, change, text):
    """Pins strictness of padded input: a mask that is 1 on padding, padding on both
    sides or inside a row, a non-0/1 padding mask, a column of the wrong shape: each a
    fatal error naming the file, the row, the column and the preset."""
    path = str(tmp_path / f"b.{fmt}")
    write_columns(change(_verl_arrays()), path)
    with pytest.raises(AuditInputError) as info:
        audit(path, preset="verl")
    assert path in str(info.value) and text in str(info.value)


def test_auto_padding_finds_either_side_but_not_both(tmp_path):
    """Pins "auto": all-left and all-right batches are read; a batch mixing the two in
    different rows is refused, naming both rows."""
    cols = _rollouts(seed=8, n=10, mean_len=4)
    want = to_json(audit(to_records(cols)))
    for side in ("left", "right"):
        arrays = padded_twin(cols, "default", response_side=side, prompt_side=side)
        write_columns(arrays, str(tmp_path / "x.npz"))
        rep = audit(str(tmp_path / "x.npz"))
        rep["sources"] = ["<records>"]
        for it in rep["worst_sequences"]:
            it["source"] = "<records>"
        assert to_json(rep) == want
    left = padded_twin(cols, "default", response_side="left")
    right = padded_twin(cols, "default", response_side="right")
    mixed = {
        k: np.concatenate([left[k][:5], right[k][5:]])
        for k in left
        if left[k].ndim == 2 and left[k].shape == right[k].shape
    }
    mixed["id"] = left["id"]
    write_columns(mixed, str(tmp_path / "m.npz"))
    with pytest.raises(AuditInputError, match="the side must be the same for every row"):
        audit(str(tmp_path / "m.npz"))


def test_mask_only_padding_ends_at_the_last_trained_token(tmp_path):
    """Pins padding found from a loss mask alone: a row ends after its last mask 1, so
    trailing masked tokens count as padding (documented; give an attention mask to keep
    them)."""
    cols = _rollouts(seed=9, n=12, mean_len=5, mask_rate=1.0)
    arrays = padded_twin(cols, "default")
    del arrays["attention_mask"]
    write_columns(arrays, str(tmp_path / "x.npz"))
    rep = audit(str(tmp_path / "x.npz"))
    assert rep["tokens"] == rep["response_tokens"] == sum(len(r["response_ids"]) for r in to_records(cols))


def test_response_length_longer_than_tokens_is_excluded_and_named(tmp_path):
    import torch

    samples = slime_samples(_rollouts(seed=4, n=3, mean_len=4))
    samples[1]["response_length"] = len(samples[1]["tokens"]) + 2
    torch.save({"samples": samples}, tmp_path / "s.pt")
    rep = audit(str(tmp_path / "s.pt"), preset="slime")
    (issue,) = rep["issues"]
    assert issue["row"] == 1 and issue["field"] == "response_length"
    assert issue["kind"] == "count_mismatch" and "> " in issue["message"]


def test_presets_read_jsonl_with_both_parsers(tmp_path):
    """Pins renamed columns and the response_length split on JSONL: pyarrow blocks and
    json line by line agree, and the report is the ragged one."""
    import json

    cols = _rollouts(seed=2, n=30, mismatch_rate=0.5)
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in slime_samples(cols)))
    fast = audit(str(path), preset="slime", chunk_tokens=50)
    slow = audit(str(path), preset="slime", jsonl_parser="python")
    assert to_json(fast) == to_json(slow)
    want = audit(to_records(cols))
    for k in ("tokens", "mean_abs_diff", "abs_diff_quantiles", "importance_ratio", "sequence"):
        assert fast[k] == want[k]


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_width_0_padded_batch_reads_as_empty_sequences(tmp_path, side):
    """Pins width-0 padded columns (every response empty, no padding): numpy's argmax
    raised on their empty rows; they read as empty sequences (the report of their ragged twin: the @example above)."""
    cols = _rollouts(seed=23, n=1, mean_len=6, prompt_len=3)
    assert cols["response_ids"][1][-1] == 0  # the one response is empty
    arrays = padded_twin(cols, "default", response_side=side, prompt_side=side, extra=0, seed=1)
    assert arrays["response_ids"].shape == (1, 0) and "attention_mask" in arrays
    write_columns(arrays, str(tmp_path / "r.npz"))
    got = audit(str(tmp_path / "r.npz"))
    assert got["sequences"] == 1 and got["tokens"] == 0
