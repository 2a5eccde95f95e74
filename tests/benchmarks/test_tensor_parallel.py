"""The tensor-parallel benchmark's plumbing (detsample/benchmarks/tensor_parallel.py), at sizes
small enough for the default suite (2 ranks, started by fork).

Pins: a timing that is not positive or misses a workload, a combine table that drops a
way, and a side name that is silently taken for another.
"""

from __future__ import annotations

import pytest
import transformers.models.llama.modeling_llama  # noqa: F401  (forked ranks inherit the import)

from detsample.benchmarks.tensor_parallel import combine_cost, steps


@pytest.mark.parametrize("model", ["hf-tiny-llama", "moe"])
def test_steps_time_both_workloads(model):
    t = steps(
        model, 2, "portable", prefill_len=6, decode_batch=2, cache_len=4, rounds=1, start_method="fork", timeout=120
    )
    assert set(t) == {"prefill", "decode", "cpu_prefill", "cpu_decode"} and min(t.values()) > 0


def test_combine_cost_times_every_way():
    t = combine_cost(2, rows=4, hidden=16, rounds=1, start_method="fork", timeout=120)
    assert len(t) == 4 and min(t.values()) > 0
    assert any("exact combine" in k for k in t) and any("all_reduce" in k for k in t)


def test_unknown_side_is_refused():
    with pytest.raises(ValueError, match="side must be one of"):
        steps("hf-tiny-llama", 2, "verified")
