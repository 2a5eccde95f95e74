"""Numbers spelt plainly (detsample/inputs/numbers.py).

Bug pinned: ``--rollout-rs-threshold 1_2_3`` was read as lower 1, upper 23 (Python's float
accepts ``_`` as a digit separator).
"""

from __future__ import annotations

import math

import pytest

from detsample.inputs import parse_float, parse_int


@pytest.mark.parametrize(
    "text,value",
    [("1", 1.0), ("-0.5", -0.5), (".5", 0.5), ("1e-3", 1e-3), ("2.", 2.0), ("inf", math.inf), ("+1E5", 1e5)],
)
def test_plain_floats_are_read(text, value):
    assert parse_float(text) == value


@pytest.mark.parametrize("text", ["1_2_3", "2_3", " 1", "1 ", "١", "", "0x10", "1e", "--1"])
def test_other_spellings_are_refused_by_name(text):
    with pytest.raises(ValueError, match="not a number"):
        parse_float(text)


def test_integers():
    assert parse_int("-12") == -12
    for text in ("1_000", "1.0", " 3", "٣"):
        with pytest.raises(ValueError, match="not an integer"):
            parse_int(text)
