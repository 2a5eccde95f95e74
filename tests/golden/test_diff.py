"""Tests of detsample/goldendiff.py: bitwise comparison and its report."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.golden.diff import compare, ulp_distance
from tests.golden_helpers import make

ULP_CASES = [  # (golden bits, obtained bits, expected distance)
    (0x3F800000, 0x3F800001, 1),
    (0x3F800000, 0x3F800000, 0),
    (0x00000000, 0x80000000, 0),  # +0 vs -0: zero ULP apart but bits differ
    (0x00000001, 0x80000001, 2),  # crosses zero
    (0x7FC00000, 0x7FC00001, -1),  # NaN payload
    (0x7F7FFFFF, 0x7F800000, 1),  # max float -> inf
]


@pytest.mark.parametrize("g,o,d", ULP_CASES)
def test_ulp_distance(g, o, d):
    assert ulp_distance(np.array([g], np.uint32), np.array([o], np.uint32)).tolist() == [d]


def test_identical_is_ok():
    d = compare("s", make([1, 2, 3]), make([1, 2, 3]))
    assert d.ok and d.first is None and "unchanged" in d.summary()


BIT_ONLY_CASES = [
    ("negative zero", 0x00000000, 0x80000000, "0 (sign of zero)"),
    ("nan payload", 0x7FC00000, 0x7FC00001, "NaN"),
    ("one ulp", 0xBF800000, 0xBF800001, "1"),
    ("far", 0xBF800000, 0xBF800100, "129-256"),
]


@pytest.mark.parametrize("name,g,o,bucket", BIT_ONLY_CASES, ids=[c[0] for c in BIT_ONLY_CASES])
def test_bit_changes_are_mismatches(name, g, o, bucket):
    """Bug pinned: comparing with == on floats (misses -0.0 and NaN payload changes)."""
    gold = make([0x3F000000, g, 0x3F000000])
    obt = make([0x3F000000, o, 0x3F000000])
    d = compare("s", gold, obt)
    assert not d.ok
    assert d.logprob_mismatches == 1 and d.token_mismatches == 0
    assert d.first.index == 1 and d.first.rid == "r1" and d.first.position == 4
    assert d.ulp_histogram == {bucket: 1}


def test_report_names_first_divergence_and_worst():
    gold = make([0x3F000000] * 6, tokens=[5] * 6)
    obt = make([0x3F000000, 0x3F000001, 0x3F000000, 0x3F000100, 0x3F000000, 0x3F000000], tokens=[5, 5, 5, 5, 9, 5])
    d = compare("scn", gold, obt, worst=2)
    assert (d.token_mismatches, d.logprob_mismatches) == (1, 2)
    assert d.first.index == 1 and d.first.ulp == 1
    assert [w.index for w in d.worst] == [4, 3]  # token change first, then largest ULP
    text = d.report()
    assert "first divergence: request r1 position 4 (entry 1)" in text
    assert "token 5 -> 9" in text and "logprob ULP histogram: 1: 1, 129-256: 1" in text


def test_length_change_is_mismatch():
    """Bug pinned: a shorter obtained output passing because its prefix matches."""
    d = compare("s", make([1, 2, 3]), make([1, 2]))
    assert not d.ok and "3 -> 2 entries" in d.summary()


LENGTH_CASES = [  # (golden entries, obtained entries, the side that has the extra entry)
    (3, 2, "golden"),
    (2, 3, "obtained"),
]


@pytest.mark.parametrize("n_gold,n_obt,side", LENGTH_CASES)
def test_length_change_names_first_unmatched_entry(n_gold, n_obt, side):
    """Bug pinned: a request that generates one token more (or less) at the end, with the
    common prefix equal, was reported as "3 -> 2 entries, 0 tokens differ" with no
    request, position or token to look at."""
    bits = [0x3F000000, 0x3F000001, 0x3F000002]
    d = compare("s", make(bits[:n_gold]), make(bits[:n_obt]))
    text = d.report()
    assert "first divergence: entry 2: only the " + side in text
    assert "request r0 position 5: token 14, logprob 0x3f000002" in text


def test_label_change_is_mismatch():
    d = compare("s", make([1, 2]), make([1, 2], positions=[3, 9]))
    assert not d.ok and d.label_mismatches == 1 and d.first.index == 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=30), st.data())
def test_every_flip_is_found(bits, data):
    """Property: flipping any set of bits in any entries is reported at exactly those
    entries, the first divergence is the smallest of them, and nothing else moves."""
    flips = data.draw(st.dictionaries(st.integers(0, len(bits) - 1), st.integers(0, 31), max_size=5))
    moved = list(bits)
    for i, b in flips.items():
        moved[i] ^= 1 << b
    d = compare("s", make(bits), make(moved))
    assert d.logprob_mismatches == len(flips) and d.token_mismatches == 0
    assert d.ok == (not flips)
    if flips:
        assert d.first.index == min(flips)
        assert sum(d.ulp_histogram.values()) == len(flips)


TOP_CASES = [  # (obtained counts, ids, bits) vs golden [2, 0, 1] ids [5, 9, 4] bits [a, b, c]
    ([2, 0, 1], [5, 9, 4], [0xBF800000, 0xBF800001, 0xBF800002], 0, None),
    ([2, 0, 1], [5, 9, 4], [0xBF800000, 0xBF800002, 0xBF800002], 1, "position 3 rank 1: id 9 0xbf800001"),
    ([2, 0, 1], [5, 8, 4], [0xBF800000, 0xBF800001, 0xBF800002], 1, "rank 1: id 9 0xbf800001 (-1.0000001) -> id 8"),
    ([2, 0, 0], [5, 9], [0xBF800000, 0xBF800001], 1, "position 5: 1 top logprobs in the golden, 0 obtained"),
]


@pytest.mark.parametrize("counts,ids,bits,n_bad,first", TOP_CASES)
def test_top_logprobs_compared_on_bits(counts, ids, bits, n_bad, first):
    """Bug pinned: goldens that record only the sampled logprob, so a kernel change that
    moves only the top-n logprobs passes."""
    from tests.golden_helpers import with_top

    gold = with_top(make([1, 2, 3]), [2, 0, 1], ids=[5, 9, 4])
    d = compare("s", gold, with_top(make([1, 2, 3]), counts, ids=ids, bits=bits))
    assert d.ok == (n_bad == 0) and d.top.mismatches == n_bad
    assert d.token_mismatches == 0 and d.logprob_mismatches == 0
    if first:
        assert first in d.top.first and f"{n_bad} top logprobs differ" in d.summary()


def test_golden_without_top_logprobs_says_regenerate():
    from tests.golden_helpers import with_top

    d = compare("s", make([1, 2]), with_top(make([1, 2]), [3, 0]))
    assert not d.ok and "the golden records no top logprobs but 3 were obtained" in d.report()
