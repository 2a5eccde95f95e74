"""AuditOptions: one frozen object, validated at construction (detsample/audit/running/options.py)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from detsample.audit import AuditOptions, audit, audit_accumulator
from detsample.audit.inputs.layout import PRESETS

BAD_OPTIONS = [
    (
        dict(rescore="hf"),
        "rescore must be a callable, a model (hf-tiny-llama, hf-tiny-qwen2, "
        "refmodel, refmodel-float, a directory or package.module:factory) or None, got 'hf'",
    ),
    (dict(rescore=3), "rescore must be a callable"),
    (dict(chunk_tokens=0), "chunk_tokens must be an integer >= 1, got 0"),
    (dict(chunk_tokens=2.5), "chunk_tokens must be an integer >= 1, got 2.5"),
    (dict(workers=0), "workers must be an integer >= 1, got 0"),
    (dict(workers=True), "workers must be an integer >= 1, got True"),
    (dict(jsonl_parser="fast"), "jsonl_parser must be one of"),
    (dict(compare_dtype="int8"), "compare_dtype must be one of"),
    (dict(strict=1), "strict must be a bool"),
    (dict(layout="verl"), "layout must be a Layout"),
    (dict(ray=""), "ray must be None"),
]


@pytest.mark.parametrize("kw,msg", BAD_OPTIONS)
def test_audit_options_validated_at_construction(kw, msg):
    """The options travel as one frozen AuditOptions, validated where it is built (a bad
    name used to surface only inside a worker, or not at all)."""
    with pytest.raises(ValueError, match=re.escape(msg)):
        AuditOptions(**kw)
    with pytest.raises(ValueError, match=re.escape(msg)):
        audit([], **kw)


def test_options_object_and_fields_are_exclusive():
    with pytest.raises(ValueError, match="not both"):
        audit_accumulator([], options=AuditOptions(), strict=True)
    assert (
        audit_accumulator([], options=AuditOptions(strict=True)).report() == audit_accumulator([], strict=True).report()
    )


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
