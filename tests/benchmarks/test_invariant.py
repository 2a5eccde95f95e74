"""The invariant-mode benchmark's plumbing (detsample/benchmarks/invariant.py), on sizes
small enough for the default suite.

Pins: a benchmark that times the wrong side (both default, or a cache that grows between
rounds) or whose table drops a workload.
"""

from __future__ import annotations

from detsample.benchmarks.invariant import build, measure, table


def test_both_sides_are_timed_with_their_own_kernels():
    assert build("hf-tiny-llama", True).batch_invariant
    assert not build("hf-tiny-llama", False).batch_invariant
    timings = measure("hf-tiny-llama", prefill_len=6, decode_batch=2, cache_len=5, rounds=1,
                      threads=1)
    assert [t.workload for t in timings] == ["prefill 6 x 1", "decode 2 x cache 5"]
    assert all(t.default_s > 0 and t.mode_s > 0 for t in timings)
    text = table(timings)
    assert text.count("\n") == 3 and "hf-tiny-llama" in text and "x |" in text
