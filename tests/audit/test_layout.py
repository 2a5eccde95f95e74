"""Column layouts: --columns parsing, presets, resolution against a file's columns
(detsample/audit/inputs/layout.py)."""

from __future__ import annotations

import pytest

from detsample.audit.inputs.layout import (
    PRESETS,
    ROLES,
    ROW_NUMBER,
    SEMANTICS_COLUMNS,
    Layout,
    Source,
    make_layout,
    parse_columns,
    resolve,
)
from detsample.audit.issues import AuditInputError

BAD_COLUMNS = [
    # (text, message)
    ("engine_logprobs", "expected dst=src"),
    ("engine=rollout_log_probs", "unknown column 'engine'"),
    ("mask=a,mask=b", "mask given twice"),
    ("engine_logprobs=", "non-empty"),
    ("engine_logprobs=a*b", "product of columns"),
    ("mask=a**b", "malformed product"),
    ("prompt_ids=<row>", "stands only for the id column"),
]


@pytest.mark.parametrize("text,message", BAD_COLUMNS)
def test_bad_columns_are_named(text, message):
    """Pins --columns validation: each bad entry is a ValueError naming it."""
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        parse_columns(text)


def test_columns_parse_and_override_a_preset():
    got = parse_columns(" engine_logprobs=rollout_log_probs , trainer_logprobs=old_log_probs,")
    assert got == {"engine_logprobs": "rollout_log_probs", "trainer_logprobs": "old_log_probs"}
    layout = make_layout("verl", "trainer_logprobs=my_lp")
    assert layout.source("trainer_logprobs") == Source(("my_lp",), required=True)
    assert layout.source("engine_logprobs").candidates == ("rollout_log_probs",)
    assert layout.describe() == "preset verl, --columns"
    assert make_layout(columns="mask=m").describe() == "--columns"
    assert make_layout().describe() == "default columns"


def test_layout_validation():
    with pytest.raises(ValueError, match="unknown column"):
        Layout("x", (("nope", Source(("a",))),))
    with pytest.raises(ValueError, match="response_padding"):
        Layout(response_padding="up")
    with pytest.raises(ValueError, match="split"):
        Layout(split="middle")
    with pytest.raises(ValueError, match="preset must be one of"):
        make_layout("deepspeed")
    with pytest.raises(ValueError, match="padding must be one of"):
        make_layout(padding="up")


VERL_COLUMNS = [
    "uid",
    "prompts",
    "responses",
    "attention_mask",
    "response_mask",
    "rollout_log_probs",
    "old_log_probs",
    "input_ids",
    "position_ids",
]


def test_verl_preset_resolves_its_names():
    res = resolve(PRESETS["verl"], VERL_COLUMNS, "b.parquet")
    assert dict(res.specs) == {
        "id": "uid",
        "prompt_ids": "prompts",
        "response_ids": "responses",
        "engine_logprobs": "rollout_log_probs",
        "trainer_logprobs": "old_log_probs",
        "mask": "response_mask",
        "attention_mask": "attention_mask",
        # the per-row semantics columns, optional in every row: read where present
        **{c: c for c in SEMANTICS_COLUMNS},
    }
    # without uid, ids are row numbers
    res = resolve(PRESETS["verl"], [c for c in VERL_COLUMNS if c != "uid"], "b.parquet")
    assert res.spec("id") == ROW_NUMBER and res.id_column is None


MISSING = [
    # (layout, file columns, text in the error)
    (
        make_layout("verl"),
        ["uid", "prompts", "responses", "old_log_probs"],
        "b.parquet: column 'rollout_log_probs' (engine_logprobs, preset verl) not found; the file "
        "has: old_log_probs, prompts, responses, uid",
    ),
    (
        make_layout("verl", "trainer_logprobs=actor_lp"),
        VERL_COLUMNS,
        "column 'actor_lp' (trainer_logprobs, preset verl, --columns) not found",
    ),
    (
        make_layout(columns="engine_logprobs=rollout"),
        ["id", "prompt_ids", "response_ids"],
        "column 'rollout' (engine_logprobs, --columns) not found",
    ),
    (
        make_layout("openrlhf"),
        ["sequences", "rollout_log_probs", "attention_mask"],
        "column 'action_mask' (mask, preset openrlhf) not found",
    ),
    (
        make_layout("slime"),
        ["tokens", "rollout_log_probs"],
        "column 'response_lengths' or 'response_length' (response_length, preset slime)",
    ),
]


@pytest.mark.parametrize("layout,columns,text", MISSING)
def test_a_mapping_to_a_missing_column_names_file_column_and_preset(layout, columns, text):
    """Pins strictness: a preset's required column or a --columns source that the file
    lacks is fatal, naming the file, the column, the audit column and the layout."""
    with pytest.raises(AuditInputError) as info:
        resolve(layout, columns, "b.parquet")
    assert text in str(info.value)


def test_default_layout_keeps_absent_required_columns_for_per_row_issues():
    """Pins the default layout's behaviour: a file without engine_logprobs is audited
    with every sequence excluded as missing_column, not refused; prompt_ids is read
    when present but required only to rescore (a file without prompts audited
    0 of 40 sequences though comparing two logprob columns needs no prompt)."""
    res = resolve(make_layout(), ["id", "response_ids", "trainer_logprobs"], "x.npz")
    assert res.spec("engine_logprobs") == "engine_logprobs"
    assert "engine_logprobs" in res.required()
    assert res.spec("prompt_ids") == "prompt_ids" and "prompt_ids" not in res.required()
    assert res.spec("attention_mask") is None


def test_input_ids_by_columns_splits_by_response_length():
    layout = make_layout(columns="input_ids=tokens,response_length=rl")
    res = resolve(layout, ["id", "tokens", "rl", "engine_logprobs"], "x.jsonl")
    assert res.split == "response_length" and res.spec("prompt_ids") is None
    with pytest.raises(AuditInputError, match="needs a response_length column"):
        resolve(make_layout(columns="input_ids=tokens"), ["id", "tokens", "engine_logprobs"], "x.jsonl")


def test_product_candidates_fall_back():
    """Pins the TRL mask: completion_mask * tool_mask when the batch has a tool_mask,
    completion_mask alone otherwise."""
    cols = [
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        "sampling_per_token_logps",
        "old_per_token_logps",
    ]
    assert resolve(PRESETS["trl"], cols + ["tool_mask"], "t.pt").spec("mask") == "completion_mask*tool_mask"
    res = resolve(PRESETS["trl"], cols, "t.pt")
    assert res.spec("mask") == "completion_mask"
    assert res.spec("attention_mask") == "completion_mask"
    assert [c for c, _ in res.wants()].count("completion_mask") == 1  # read once


def test_every_preset_names_only_known_columns():
    for name, layout in PRESETS.items():
        assert layout.name == name
        assert {d for d, _ in layout.sources} <= set(ROLES)
