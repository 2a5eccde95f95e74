"""The numba kernels' threads (detsample/arith/team.py, arith/cpu.py ``_run``): torch's
OpenMP team where torch runs on one, else a pool; the fused greedy pass and the rows
split over threads by columns.

Bugs it would catch: the team never found on a Linux torch with OpenMP (the pool taken
silently, with its contention), a span's exception swallowed by the ctypes callback, a
span run twice or never, a nested call or a call from a Python thread that hangs, a
row split over threads whose words are summed wrong (a part dropped, the NaN / -inf
rows given a value), the fused greedy pass taking another token than argmax or another
logprob than log_softmax_at, a result that depends on who ran a span.
"""

from __future__ import annotations

import ctypes
import sys
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import arith
from detsample.arith import cpu, team
from detsample.ops import draw

OPENMP = "parallel backend: OpenMP" in torch.__config__.parallel_info()


@pytest.fixture(params=["team", "pool"])
def runner(request, monkeypatch):
    """Each test under torch's team and under the pool (2 threads)."""
    if request.param == "team" and team.runtime() is None:
        pytest.skip("torch runs on no OpenMP team here")
    if request.param == "pool":
        monkeypatch.setattr(team, "runtime", lambda: None)
    prev = torch.get_num_threads()
    torch.set_num_threads(2)
    yield request.param
    torch.set_num_threads(prev)


@pytest.mark.skipif(not (OPENMP and sys.platform == "linux"), reason="torch without OpenMP, or not Linux")
def test_the_team_is_found_where_torch_runs_on_openmp():
    rt = team.runtime()
    assert rt is not None
    assert "omp" in rt.path.rsplit("/", 1)[-1]


def test_every_span_runs_once(runner):
    spans = [(i, i + 1) for i in range(37)]
    seen: list[int] = []
    lock = threading.Lock()

    def fn(s, e):
        with lock:
            seen.append(s)

    cpu._run(fn, spans)
    assert sorted(seen) == list(range(37))


def test_spans_run_on_openmp_threads_of_the_team():
    rt = team.runtime()
    if rt is None:
        pytest.skip("torch runs on no OpenMP team here")
    num = ctypes.CDLL(rt.path).omp_get_thread_num
    got: set[int] = set()
    barrier = threading.Barrier(2, timeout=10)

    def work():
        got.add(num())
        barrier.wait()  # both team threads in the work at once

    rt.run(work, 2)
    assert got == {0, 1}


def test_an_exception_in_a_span_reaches_the_caller(runner):
    def fn(s, e):
        if s == 5:
            raise ValueError("span 5")

    with pytest.raises(ValueError, match="span 5"):
        cpu._run(fn, [(i, i + 1) for i in range(9)])
    cpu._run(lambda s, e: None, [(0, 1), (1, 2)])  # and the threads are usable after


def test_a_nested_call_and_a_call_from_a_python_thread_complete(runner):
    inner: list[int] = []
    lock = threading.Lock()

    def fn(s, e):
        def add(a, b):
            with lock:
                inner.append(a)

        cpu._run(add, [(s * 10 + j, 0) for j in range(3)])

    cpu._run(fn, [(i, i + 1) for i in range(4)])
    assert sorted(inner) == sorted(i * 10 + j for i in range(4) for j in range(3))
    x = torch.randn(3, 70000)
    want = arith.log_softmax(x)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("lsm", arith.log_softmax(x)))
    t.start()
    t.join(timeout=60)
    assert torch.equal(out["lsm"].view(torch.int32), want.view(torch.int32))


def _rows(rng, rows: int, n: int, family: str) -> torch.Tensor:
    x = rng.standard_normal((rows, n)).astype(np.float32) * 3
    if family == "ties":
        x = np.round(x)
    elif family == "special":  # a NaN row, a +inf row, a row of -inf, a finite one
        x[0, n // 3] = np.nan
        if rows > 1:
            x[1, n - 1] = np.inf
        if rows > 2:
            x[2] = -np.inf
    elif family == "neginf":
        x[rng.random((rows, n)) < 0.5] = -np.inf
    return torch.from_numpy(x)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 5),
    st.sampled_from([1, 7, 300, 4099, 65536, 70001]),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["randn", "ties", "special", "neginf"]),
)
def test_greedy_is_argmax_and_log_softmax_at(rows, n, seed, family):
    x = _rows(np.random.default_rng(seed), rows, n, family)
    tok, lp = arith.greedy(x)
    want_tok = torch.argmax(x, dim=-1)
    assert torch.equal(tok, want_tok)
    want_lp = arith.log_softmax_at(x, want_tok, impl="torch")
    assert torch.equal(lp.view(torch.int32), want_lp.view(torch.int32))


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("family", ["randn", "special", "neginf"])
def test_rows_split_by_columns_have_the_rows_bits(runner, rows, family):
    """Fewer rows than threads and long rows: each row's sum split over the threads
    (the words summed as integers) against the reference and one thread."""
    x = _rows(np.random.default_rng(rows), rows, 152064, family)
    assert cpu.column_parts(1, 152064) > 1  # the split is taken at one row
    ids = torch.arange(rows) * 1000
    got = (arith.greedy(x), arith.normalisers(x)[1], arith.log_softmax_at(x, ids))
    ref_norm = arith.normalisers(x, impl="torch")[1]
    assert torch.equal(got[1].view(torch.int64), ref_norm.view(torch.int64))
    ref_at = arith.log_softmax_at(x, ids, impl="torch")
    assert torch.equal(got[2].view(torch.int32), ref_at.view(torch.int32))
    torch.set_num_threads(1)
    one = arith.greedy(x)
    assert torch.equal(got[0][0], one[0]) and torch.equal(got[0][1].view(torch.int32), one[1].view(torch.int32))


def test_greedy_with_logprob_takes_the_torch_path_off_numba():
    x = torch.randn(4, 500, dtype=torch.float32)
    tok, lp = draw.greedy_with_logprob(x)
    assert torch.equal(tok, torch.argmax(x, -1))
    x64 = x.to(torch.float64)
    assert arith.greedy(x64) is None
