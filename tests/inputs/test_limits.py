"""Thread and memory bounds (detsample/inputs/limits.py).

Bug pinned: ``bench --threads 100000`` and ``probe ops --threads 1,100000`` crashed the
process (OpenMP, exit 139); ``bench --vocab 100000000000`` tried to allocate 400 GB.
"""

from __future__ import annotations

import os

import pytest

from detsample.inputs import max_threads, memory_problem, thread_problem
from detsample.inputs.limits import THREAD_OVERSUBSCRIPTION, memory_bytes


def test_thread_counts_are_bounded_by_the_machine():
    limit = THREAD_OVERSUBSCRIPTION * (os.cpu_count() or 1)
    assert max_threads() == limit
    assert thread_problem(1) is None and thread_problem(limit) is None
    assert f"must be at most {limit}" in thread_problem(limit + 1)
    assert thread_problem(100000).endswith("got 100000")


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "2"])
def test_a_thread_count_is_a_positive_integer(bad):
    assert thread_problem(bad).startswith("must be an integer >= 1")


def test_memory_is_bounded_by_the_machine():
    total = memory_bytes()
    if total is None:
        pytest.skip("this OS does not report its physical memory")
    assert memory_problem(1 << 20, "1 MiB") is None
    assert "--vocab 1e11" in memory_problem(4 * 10**11, "--vocab 1e11")
