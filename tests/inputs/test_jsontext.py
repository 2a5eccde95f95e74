"""JSON with bounded nesting (detsample/inputs/jsontext.py).

Bug pinned: ``[[[[...`` 100,000 levels deep raised RecursionError out of ``json.loads`` in
the audit, the audit log and golden manifests (a traceback).
"""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.inputs import loads
from detsample.inputs.jsontext import JsonTooDeep


@settings(max_examples=30, deadline=None, derandomize=True)
@given(depth=st.integers(1, 20_000), opener=st.sampled_from(["[", '{"a":']))
def test_any_depth_parses_or_is_a_named_value_error(depth, opener):
    closer = "]" if opener == "[" else "}"
    text = opener * depth + "1" + closer * depth
    try:
        obj = loads(text)
    except JsonTooDeep as exc:
        assert depth > 100 and str(sys.getrecursionlimit()) in str(exc)
        assert isinstance(exc, ValueError)
        return
    for _ in range(depth):
        obj = obj[0] if opener == "[" else obj["a"]
    assert obj == 1


def test_invalid_json_is_json_s_own_error():
    with pytest.raises(json.JSONDecodeError):
        loads("{")
