"""Tests of detsample/goldenfmt.py: the golden text format round-trips bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.golden.format import (
    LOGPROBS,
    MANIFEST,
    TOKENS,
    GoldenFormatError,
    ScenarioOutput,
    concat,
    decode,
    encode,
    float_text,
)
from tests.golden_helpers import make

SPECIAL_BITS = [
    0x00000000,
    0x80000000,
    0x7FC00000,
    0x7FC00001,
    0xFFC00000,
    0x7F800000,
    0xFF800000,
    0x00000001,
    0x7F7FFFFF,
    0xBF800000,
]


def test_special_bits_round_trip():
    """Bug pinned: -0.0 and NaN payloads lost in text form (decimal-only formats do that)."""
    out = make(SPECIAL_BITS)
    back, manifest = decode(encode(out, "s", {"platform": "p"}))
    assert back.bits().tobytes() == out.bits().tobytes()
    assert back.tokens.tobytes() == out.tokens.tobytes()
    assert back.labels == out.labels
    assert manifest["arrays"]["logprobs"]["dtype"] == "<f4"
    assert manifest["arrays"]["tokens"]["dtype"] == "<i8"
    assert manifest["arrays"]["tokens"]["shape"] == [len(SPECIAL_BITS)]


def test_line_format_is_one_value_per_line():
    """Bug pinned: a diff of logprobs.txt must point at the exact entry that moved."""
    texts = encode(make([0xBF800000, 0x80000000]), "s", {})
    assert texts[LOGPROBS].splitlines() == ["0xbf800000 -1.0 r0@3", "0x80000000 -0.0 r1@4"]
    assert texts[TOKENS].splitlines() == ["0 r0@3", "7 r1@4"]


def test_encoding_is_deterministic():
    """Bug pinned: regenerating goldens twice must give byte-identical files."""
    out = make(SPECIAL_BITS)
    assert encode(out, "s", {"x": 1}) == encode(make(SPECIAL_BITS), "s", {"x": 1})


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=40))
def test_any_bits_round_trip(bits):
    """Property: every float32 bit pattern survives encode/decode."""
    out = make(bits)
    back, _ = decode(encode(out, "s", {}))
    assert back.bits().tobytes() == out.bits().tobytes()


def _edit(texts, fname, old, new):
    t = dict(texts)
    assert old in t[fname]
    t[fname] = t[fname].replace(old, new, 1)
    return t


CORRUPTIONS = [
    ("hand-edited bits", lambda t: _edit(t, LOGPROBS, "0xbf800000 -1.0", "0xbf800001 -1.0000001")),
    ("decimal disagrees", lambda t: _edit(t, LOGPROBS, "-1.0 ", "-2.0 ")),
    ("edited token", lambda t: _edit(t, TOKENS, "7 r1@4", "8 r1@4")),
    ("truncated", lambda t: {**t, TOKENS: t[TOKENS].splitlines(True)[0], LOGPROBS: t[LOGPROBS].splitlines(True)[0]}),
    ("labels disagree", lambda t: _edit(t, TOKENS, "r1@4", "r1@5")),
    ("schema", lambda t: _edit(t, MANIFEST, '"schema_version": 1', '"schema_version": 2')),
    ("not json", lambda t: {**t, MANIFEST: "{"}),
    ("bad line", lambda t: _edit(t, TOKENS, "7 r1@4", "7")),
]


@pytest.mark.parametrize("name,corrupt", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_corruption_detected(name, corrupt):
    """Bug pinned: a hand edit of a golden silently becoming the new truth."""
    texts = encode(make([0xBF800000, 0x3F000000]), "s", {})
    with pytest.raises(GoldenFormatError):
        decode(corrupt(texts))


BAD_OUTPUTS = [
    ("float64 logprobs", dict(logprobs=np.zeros(1, np.float64))),
    ("float tokens", dict(tokens=np.zeros(1, np.float32))),
    ("space in rid", dict(rids=("a b",))),
    ("at in rid", dict(rids=("a@b",))),
    ("shape", dict(positions=np.zeros(2, np.int64))),
]


@pytest.mark.parametrize("name,kw", BAD_OUTPUTS, ids=[b[0] for b in BAD_OUTPUTS])
def test_bad_output_rejected(name, kw):
    """Bug pinned: a float64 or mislabelled output written as a golden."""
    base = dict(
        rids=("a",), positions=np.zeros(1, np.int64), tokens=np.zeros(1, np.int64), logprobs=np.zeros(1, np.float32)
    )
    with pytest.raises(GoldenFormatError):
        ScenarioOutput(**{**base, **kw})


def test_float_text_is_shortest_round_trip():
    for b in SPECIAL_BITS:
        f = np.array([b], np.uint32).view(np.float32)[0]
        if not np.isnan(f):
            assert np.float32(float_text(b)).view(np.uint32) == b


def test_concat_keeps_order():
    a, b = make([1, 2]), make([3])
    c = concat([a, b])
    assert c.bits().tolist() == [1, 2, 3]
    assert concat([]).tokens.shape == (0,)


def test_top_logprobs_round_trip_and_file():
    """Entries of rows asking for top logprobs get them in top_logprobs.txt (rank 0
    first, labelled <request>@<position>#<rank>); other entries have none."""
    from detsample.golden.format import TOP_LOGPROBS
    from tests.golden_helpers import with_top

    out = with_top(make([1, 2, 3]), [2, 0, 1], ids=[5, 9, 4], bits=[0x80000000, 0xBF800000, 0x7FC00001])
    texts = encode(out, "s", {})
    assert texts[TOP_LOGPROBS].splitlines() == [
        "5 0x80000000 -0.0 r0@3#0",
        "9 0xbf800000 -1.0 r0@3#1",
        "4 0x7fc00001 nan r0@5#0",
    ]
    assert list(texts) == [TOKENS, LOGPROBS, TOP_LOGPROBS, MANIFEST]  # manifest written last
    back, manifest = decode(texts)
    assert back.top_counts.tolist() == [2, 0, 1] and back.top_ids.tolist() == [5, 9, 4]
    assert back.top_logprobs.view(np.uint32).tolist() == [0x80000000, 0xBF800000, 0x7FC00001]
    assert manifest["arrays"]["top_logprobs"]["shape"] == [3]
    assert back.take([2, 0]).top_ids.tolist() == [4, 5, 9]
    assert TOP_LOGPROBS not in encode(make([1]), "s", {})  # no row asks: no file


TOP_DAMAGE = [
    (lambda t: t.replace("r0@3#1", "r0@3#2"), GoldenFormatError, "next rank"),
    (lambda t: "\n".join(reversed(t.splitlines())) + "\n", GoldenFormatError, "next rank"),
    (lambda t: t.replace("9 0xbf800001", "8 0xbf800001"), None, "top_ids differ"),
    (lambda t: "", None, "differ from manifest.json"),
]


@pytest.mark.parametrize("edit,exc,msg", TOP_DAMAGE, ids=["rank", "order", "id", "deleted"])
def test_top_logprobs_damage_detected(edit, exc, msg):
    from detsample.golden.format import TOP_LOGPROBS, decode_lenient
    from tests.golden_helpers import with_top

    texts = encode(with_top(make([1, 2, 3]), [2, 0, 1], ids=[5, 9, 4]), "s", {})
    texts[TOP_LOGPROBS] = edit(texts[TOP_LOGPROBS])
    if exc is not None:
        with pytest.raises(exc, match=msg):
            decode(texts)
    else:
        _, _, problems = decode_lenient(texts)
        assert any(msg in p for p in problems), problems
