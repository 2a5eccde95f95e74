"""Tests of detsample/golden/bits.py: per-dtype bit patterns, distances, histograms."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from detsample.golden import bits as B

DIST_CASES = [  # (dtype, golden bits, obtained bits, distance, either is NaN)
    ("float32", 0x3F800000, 0x3F800001, 1, False),
    ("float32", 0x00000001, 0x80000001, 2, False),  # crosses zero
    ("float32", 0x00000000, 0x80000000, 0, False),  # sign of zero: 0 ulp, other bits
    ("float32", 0x7FC00000, 0x7FC00001, 1, True),  # NaN payload
    ("float64", 0x3FF0000000000000, 0x3FF0000000000003, 3, False),
    ("float64", 0x7FEFFFFFFFFFFFFF, 0xFFEFFFFFFFFFFFFF, 2 * 0x7FEFFFFFFFFFFFFF, False),  # -max..max
    ("float16", 0x3C00, 0x3C01, 1, False),
    ("float16", 0x7E00, 0x7E01, 1, True),
    ("bfloat16", 0x3F80, 0x3F81, 1, False),
    ("bfloat16", 0x3F80, 0xBF80, 2 * 0x3F80, False),
    ("int64", 0x7FFFFFFFFFFFFFFF, 0x8000000000000000, 2**64 - 1, False),  # max vs min
    ("int8", 0xFF, 0x01, 2, False),  # -1 vs 1
    ("uint64", 0xFFFFFFFFFFFFFFFF, 0, 2**64 - 1, False),
    ("uint8", 0x05, 0x02, 3, False),
    ("bool", 0, 1, 1, False),
]


@pytest.mark.parametrize("name,g,o,dist,nan", DIST_CASES)
def test_distance(name, g, o, dist, nan):
    """Bug pinned: int64 overflow of ULP distances of float64/int64 across the range."""
    dt = B.dtype(name)
    gb, ob = np.array([g], dt.storage), np.array([o], dt.storage)
    assert int(B.distance(gb, ob, dt)[0]) == dist
    assert bool((B.is_nan(gb, dt) | B.is_nan(ob, dt))[0]) == nan


TEXT_CASES = [  # (dtype, bits, hex, decimal)
    ("float32", 0x80000000, "0x80000000", "-0.0"),
    ("float32", 0x3DCCCCCD, "0x3dcccccd", "0.1"),
    ("float16", 0x2E66, "0x2e66", "0.1"),
    ("bfloat16", 0x3DCD, "0x3dcd", "0.100097656"),  # shortest that round-trips as float32
    ("float64", 0x7FF0000000000000, "0x7ff0000000000000", "inf"),
    ("int16", 0xFFFF, "0xffff", "-1"),
    ("uint16", 0xFFFF, "0xffff", "65535"),
    ("bool", 1, "0x01", "true"),
]


@pytest.mark.parametrize("name,b,hx,dec", TEXT_CASES)
def test_text(name, b, hx, dec):
    dt = B.dtype(name)
    assert (B.hex_text(b, dt), B.value_text(b, dt)) == (hx, dec)


def test_histogram_buckets_and_nan():
    d = np.array([0, 1, 2, 3, 4, 5, 9, 70000, 3], np.uint64)
    nan = np.array([0, 0, 0, 0, 0, 0, 0, 0, 1], bool)
    assert B.histogram(d, nan) == {
        "0 (sign of zero)": 1,
        "1": 1,
        "2": 1,
        "3-4": 2,
        "5-8": 1,
        "9-16": 1,
        ">65536": 1,
        "NaN": 1,
    }
    assert list(B.histogram(d)) == ["0 (sign of zero)", "1", "2", "3-4", "5-8", "9-16", ">65536"]


def test_unknown_dtype_named():
    with pytest.raises(ValueError, match="dtype must be one of .* got 'complex64'"):
        B.dtype("complex64")


@given(st.floats(allow_nan=False, width=32), st.floats(allow_nan=False, width=32))
def test_float32_distance_is_monotonic_order(a, b):
    """Property: the ULP distance equals the count of float32 values between a and b."""
    dt = B.FLOAT32
    x = np.array([a, b], np.float32).view(np.uint32)
    d = int(B.distance(x[:1], x[1:], dt)[0])
    lo, hi = sorted([np.float32(a), np.float32(b)])
    steps, v = 0, lo
    if d <= 64:
        while v < hi:
            v = np.nextafter(v, np.float32(np.inf), dtype=np.float32)
            steps += 1
        assert steps == d or (lo == hi and d == 0)
