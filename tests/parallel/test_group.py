"""Local rank groups: results come back, and a failing, hanging or dying rank never hangs the
parent (bounded; the rank and what happened are named)."""

from __future__ import annotations

import os
import time

import pytest
import torch

from detsample.parallel import RankError, RankGroup


def init_rank(comm, tag):
    return {"tag": tag, "rank": comm.rank}


def job_sum(state, comm, n):
    t = torch.full((n,), comm.rank + 1, dtype=torch.int64)
    comm.sum_(t)
    return {"tag": state["tag"], "sum": t, "world": comm.world}


def job_fail_on(state, comm, rank):
    if comm.rank == rank:
        raise ValueError(f"rank {rank} refuses")
    return None


def job_hang_on(state, comm, rank):
    if comm.rank == rank:
        time.sleep(60)
    return None


def job_die_on(state, comm, rank):
    if comm.rank == rank:
        os._exit(3)
    comm.barrier()
    return None


def test_call_result_then_a_hung_rank_times_out_bounded():
    with RankGroup(2, init_rank, ("x",), timeout=60) as g:  # spawn: the default
        out = g.call(job_sum, 3)
        assert out["tag"] == "x" and out["world"] == 2
        assert torch.equal(out["sum"], torch.full((3,), 3, dtype=torch.int64))
        t0 = time.monotonic()
        with pytest.raises(RankError, match=r"ranks \[1\] of 2 did not finish job_hang_on within 2 s") as e:
            g.call(job_hang_on, 1, timeout=2)
        assert e.value.kind == "timeout" and e.value.rank == 1
        assert time.monotonic() - t0 < 20
        with pytest.raises(RankError, match="closed"):
            g.call(job_sum, 1)


def test_an_error_in_a_rank_is_named():
    with RankGroup(2, init_rank, ("y",), timeout=60, start_method="fork") as g:
        with pytest.raises(
            RankError,
            match=r"rank 1 of 2 raised ValueError during job_fail_on: "
            r"rank 1 refuses",
        ) as e:
            g.call(job_fail_on, 1)
        assert e.value.kind == "ValueError" and e.value.rank == 1


def test_a_dead_rank_is_named_as_the_cause():
    with RankGroup(2, init_rank, ("z",), timeout=60, start_method="fork") as g:
        with pytest.raises(RankError, match=r"rank 0 of 2 died during job_die_on \(exit code 3\)"):
            g.call(job_die_on, 0, timeout=30)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(world=0), "world must be an int >= 1, got 0"),
        (dict(world=2, timeout=0), "timeout must be a number of seconds > 0, got 0"),
        (dict(world=2, threads=0), "threads must be an int >= 1, got 0"),
        (dict(world=2, backend="mpi"), "backend must be one of"),
        (dict(world=2, start_method="thread"), "start_method must be one of"),
    ],
)
def test_bad_arguments(kwargs, message):
    world = kwargs.pop("world")
    with pytest.raises(ValueError, match=message):
        RankGroup(world, init_rank, ("w",), **kwargs)
