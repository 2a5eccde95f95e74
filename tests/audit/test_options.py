"""AuditOptions: one frozen object, validated at construction (detsample/audit/options.py)."""

from __future__ import annotations

import dataclasses

import pytest

from detsample.audit import AuditOptions, audit
from detsample.audit.layout import PRESETS

BAD = [
    # (kwargs, text)
    (dict(workers=0), "workers must be an integer >= 1"),
    (dict(chunk_tokens=0), "chunk_tokens must be an integer >= 1"),
    (dict(workers=True), "workers must be an integer >= 1"),
    (dict(jsonl_parser="fast"), "jsonl_parser"),
    (dict(compare_dtype="bfloat16"), "compare_dtype"),
    (dict(strict=1), "strict must be a bool"),
    (dict(rescore=3), "rescore must be"),
    (dict(layout="verl"), "layout must be a Layout"),
    (dict(ray=""), "ray must be None"),
]


@pytest.mark.parametrize("kwargs,text", BAD)
def test_bad_options_are_named_at_construction(kwargs, text):
    with pytest.raises(ValueError, match=text):
        AuditOptions(**kwargs)


def test_make_builds_the_layout_and_is_frozen():
    opts = AuditOptions.make(preset="verl", columns="trainer_logprobs=lp", workers=2, ray=True)
    assert opts.layout.name == "verl" and opts.workers == 2 and opts.ray == "local"
    assert opts.layout.source("trainer_logprobs").candidates == ("lp",)
    assert AuditOptions.make(base=opts, strict=True).layout == opts.layout
    assert AuditOptions.make(preset="trl").layout == PRESETS["trl"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.workers = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match="unknown audit option"):
        AuditOptions.make(worker=2)
    with pytest.raises(ValueError, match="not both"):
        AuditOptions.make(preset="verl", layout=PRESETS["verl"])


def test_unknown_rescore_name_fails_before_reading():
    with pytest.raises(ValueError, match=r"rescore must be a callable, one of \('refmodel',\) or None"):
        audit([{"id": "a"}], rescore="gpt")
    with pytest.raises(ValueError, match="not both"):
        audit([{"id": "a"}], AuditOptions(), strict=True)
