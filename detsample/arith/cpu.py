"""The definition of :mod:`detsample.arith.spec` on CPU tensors, by numba kernels
(:mod:`detsample.arith.jit`, imported on first use).

Compiled by numba (LLVM) for the running CPU without fast-math: LLVM then keeps every
IEEE operation as written -- no contraction into fused multiply-adds, no reassociation --
and vectorises the loops at the CPU's own width, which changes no bit (each lane performs
the same operations). tests/arith holds every kernel to :mod:`detsample.arith.reference`
bit for bit, and the compiled code to having no fused multiply-add instruction. Kernels
release the GIL; a large call is split by rows or contiguous chunks over
``torch.get_num_threads()`` threads, and every result is a function of its element (or
of its row) alone, so the split changes no bit.

Compiled on first use (about a second per kernel) and cached on disk by numba
(``NUMBA_CACHE_DIR`` moves the cache).
"""

from __future__ import annotations

import functools
import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from detsample.arith import spec, team

#: below this many elements a call runs on the calling thread alone
PARALLEL_MIN = 1 << 16


@functools.cache
def jit():
    """The numba kernels module; ImportError when numba is not installed."""
    from detsample.arith import jit as kernels

    return kernels


def available() -> bool:
    """Whether the numba kernels can be used here."""
    try:
        jit()
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=8)
def _pool(n: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=n, thread_name_prefix="detsample-arith")


#: spans per thread of a parallel call: the threads take spans from one queue, so a
#: thread slowed by another process (or by torch's OpenMP workers, which spin for
#: milliseconds after a parallel region) hands its share to the others
SPANS_PER_THREAD = 4


def _chunks(total: int, elements: int) -> list[tuple[int, int]]:
    """[start, stop) spans of ``total`` units (elements or rows; ``elements`` in all)
    for this call's threads: one span below PARALLEL_MIN elements, else up to
    SPANS_PER_THREAD per thread of about PARALLEL_MIN elements or more each, a multiple
    of the thread count where there are more spans than threads (equal shares)."""
    if total <= 0:
        return []
    threads = max(1, torch.get_num_threads())
    if elements < PARALLEL_MIN or threads == 1:
        return [(0, total)]
    parts = min(threads * SPANS_PER_THREAD, total, max(threads, elements // PARALLEL_MIN))
    if parts > threads:  # whole rounds of spans: 3 spans on 2 threads cost 2 spans' time
        parts -= parts % threads
    step = -(-total // parts)
    return [(s, min(s + step, total)) for s in range(0, total, step)]


def split_rows(fn, rows: int, elements: int) -> None:
    """``fn(start, stop)`` over spans of ``rows`` rows (``elements`` in all), on this
    call's threads (:func:`_chunks`): a row is one thread's."""
    _run(fn, _chunks(rows, elements))


def _run(fn, spans: list[tuple]) -> None:
    """``fn(*span)`` for every span: on the calling thread for one, else by up to
    ``torch.get_num_threads()`` threads taking spans from one queue in order (a shared
    counter), the caller one of them -- torch's own OpenMP team where torch runs on one
    (:mod:`detsample.arith.team`: its workers are awake after torch's last operation),
    else the caller and a thread pool."""
    threads = min(len(spans), max(1, torch.get_num_threads()))
    if threads <= 1:
        for se in spans:
            fn(*se)
        return
    counter = itertools.count()  # next() on it is atomic under the GIL

    def work() -> None:
        while (i := next(counter)) < len(spans):
            fn(*spans[i])

    omp = team.runtime()
    if omp is not None:
        omp.run(work, threads)
        return
    futures = [_pool(threads - 1).submit(work) for _ in range(threads - 1)]
    try:
        work()
    finally:  # a helper not started yet has nothing left to take: cancelled, not awaited
        for f in futures:
            if not f.cancel():
                f.result()


def rows_view(x: torch.Tensor) -> np.ndarray:
    """A contiguous (rows, n) numpy view of ``x`` (..., n) (reshaped by numpy: a torch
    ``view`` costs a few microseconds, a decode step's budget)."""
    a = x.contiguous().numpy()
    return a if a.ndim == 2 else a.reshape(-1, x.shape[-1])


#: columns of a part of a row split over threads (its exps: tens of microseconds)
SPLIT_PART_MIN = 1 << 14


def column_parts(rows: int, n: int) -> int:
    """How many parts each row of a (rows, n) call is split into over the threads: 1
    unless there are fewer rows than threads and the rows are long (a row is then no
    longer one thread's, which costs a thread hand-over: at n = 32000 it eats the gain,
    measured)."""
    threads = max(1, torch.get_num_threads())
    if threads == 1 or rows >= threads or n < PARALLEL_MIN:
        return 1
    return max(2, min(threads * SPANS_PER_THREAD // max(rows, 1), n // SPLIT_PART_MIN))


def _split_log_norms(a: np.ndarray, m: np.ndarray, frac: int, parts: int) -> np.ndarray:
    """``row_log_norm`` of each row of ``a`` (rows, n) float32 with maxima ``m`` (NaN
    where the maximum is not finite), each row's columns split into ``parts`` over the
    threads: (rows,) float64, the same bits (exact integer words, summed)."""
    rows, n = a.shape
    k = jit()
    words = (np.zeros((rows, parts), dtype=np.int64), np.zeros((rows, parts), dtype=np.int64))
    ok = [bool(np.isfinite(m[r])) for r in range(rows)]
    step = -(-n // parts)
    spans = [(r, p, p * step, min(n, (p + 1) * step)) for r in range(rows) if ok[r] for p in range(parts)]
    _run(lambda *sp: k.words_part(a, m, frac, words, sp), spans)
    g = np.full(rows, np.nan)
    for r in range(rows):
        if ok[r]:
            g[r] = k.log_of_words(int(words[0][r].sum()), int(words[1][r].sum()), frac)
    return g


def _vector(n: int, dtype, shape: tuple[int, ...]) -> tuple[torch.Tensor, np.ndarray]:
    """A fresh tensor shaped ``shape`` (n elements) and its flat numpy view."""
    a = np.empty(n, dtype=dtype)
    return torch.from_numpy(a if len(shape) == 1 else a.reshape(shape)), a


def exp32(z: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """exp of a float32 CPU tensor (into ``out``, a contiguous tensor shaped like ``z``;
    it may be ``z``)."""
    src = z.contiguous()
    dst = torch.empty_like(src) if out is None else out
    a, b = src.view(-1).numpy(), dst.view(-1).numpy()
    if _overlap(src, dst):
        if src.data_ptr() != dst.data_ptr():  # a partial overlap: copy, then in place
            b[:] = a.copy()
        k1 = jit().exp_in_place
        _run(lambda s, e: k1(b[s:e]), _chunks(b.size, b.size))
        return dst
    k = jit().exp_into
    _run(lambda s, e: k(a[s:e], b[s:e]), _chunks(a.size, a.size))
    return dst


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory of two contiguous tensors overlaps."""
    ea = a.data_ptr() + a.numel() * a.element_size()
    eb = b.data_ptr() + b.numel() * b.element_size()
    return a.data_ptr() < eb and b.data_ptr() < ea


def exp64(x: torch.Tensor) -> torch.Tensor:
    """exp of a float64 CPU tensor, rounded to float32."""
    src = x.contiguous()
    dst = torch.empty(src.shape, dtype=torch.float32)
    a, b = src.view(-1).numpy(), dst.view(-1).numpy()
    k = jit().exp64_into
    _run(lambda s, e: k(a[s:e], b[s:e]), _chunks(a.size, a.size))
    return dst


def log64(x: torch.Tensor) -> torch.Tensor:
    """Natural log of a float64 CPU tensor (never large: one value per row)."""
    src = x.contiguous()
    out = torch.empty_like(src)
    jit().log_into(src.view(-1).numpy(), out.view(-1).numpy())
    return out


def normalisers(x: torch.Tensor, m: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m, G)`` of a float32 CPU tensor (..., n): the row maxima (float32; :func:`row_max`
    unless given) and log-normalisers (float64, NaN for a row whose log_softmax is all
    NaN), shaped (...)."""
    n, lead = x.shape[-1], tuple(x.shape[:-1])
    a = rows_view(x)
    m = row_max(x) if m is None else m
    g, go = _vector(a.shape[0], np.float64, lead)
    k, frac = jit().normalisers, spec.frac_bits(n)
    mo = m.to(torch.float32).contiguous().numpy().reshape(-1)
    parts = column_parts(a.shape[0], n)
    if parts > 1:
        go[:] = _split_log_norms(a, mo, frac, parts)
    else:
        _run(lambda s, e: k(a, mo, go, frac, s, e), _chunks(a.shape[0], a.size))
    return (m if tuple(m.shape) == lead else m.view(lead)), g


def log_softmax_at(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The log_softmax of each row of a (rows, n) float32 CPU tensor at one column
    ``ids`` (rows,) int64 (in range), in one kernel call: (rows,) float32."""
    a = rows_view(x)
    out, o = _vector(a.shape[0], np.float32, (a.shape[0],))
    i = (ids if ids.dtype == torch.int64 else ids.to(torch.int64)).contiguous().numpy()
    k, frac = jit().log_softmax_at_rows, spec.frac_bits(x.shape[-1])
    parts = column_parts(*a.shape)
    if parts > 1:
        m = row_max(x).numpy().reshape(-1)
        jit().picked_rows(a, i, m, _split_log_norms(a, m, frac, parts), o)
        return out
    _run(lambda s, e: k(a, i, o, frac, (s, e)), _chunks(a.shape[0], a.size))
    return out


def greedy(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's argmax of a (rows, n) float32 CPU tensor (n >= 1) and its log_softmax
    there, in one kernel call (a row split over the threads for fewer rows than
    threads: numpy's argmax, then the split normaliser): ((rows,) int64, (rows,)
    float32)."""
    a = rows_view(x)
    tok, t = _vector(a.shape[0], np.int64, (a.shape[0],))
    lp, o = _vector(a.shape[0], np.float32, (a.shape[0],))
    k, frac = jit().greedy_rows, spec.frac_bits(x.shape[-1])
    parts = column_parts(*a.shape)
    if parts > 1:  # numpy's argmax (its rule: the first maximum, the first NaN)
        t[:] = a.argmax(axis=-1)
        m = a[np.arange(a.shape[0]), t]
        jit().picked_rows(a, t, m, _split_log_norms(a, m, frac, parts), o)
        return tok, lp
    _run(lambda s, e: k(a, (t, o), frac, (s, e)), _chunks(a.shape[0], a.size))
    return tok, lp


def row_max(x: torch.Tensor) -> torch.Tensor:
    """torch's ``amax`` over the last dim of a float32 CPU tensor (NaN where a row holds a
    NaN), by numba threads (torch's own parallel ops leave OpenMP workers spinning for
    milliseconds, which the kernels after them would compete with)."""
    a = rows_view(x)
    out, o = _vector(a.shape[0], np.float32, tuple(x.shape[:-1]))
    k = jit().row_maxima
    _run(lambda s, e: k(a, o, s, e), _chunks(a.shape[0], a.size))
    return out


def log_softmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """log_softmax over the last dim of a float32 CPU tensor (into ``out``, a contiguous
    float32 tensor shaped like ``x``; not ``x`` itself)."""
    n = x.shape[-1]
    dst = torch.empty(x.shape, dtype=torch.float32) if out is None else out
    if x.numel() == 0:
        return dst
    a, b = rows_view(x), rows_view(dst)
    k, frac = jit().log_softmax_rows, spec.frac_bits(n)
    _run(lambda s, e: k(a, b, frac, s, e), _chunks(a.shape[0], a.size))
    return dst


def cut_masses(
    z: torch.Tensor,
    tau: torch.Tensor,
    least: torch.Tensor,
    floor: float,
    frac: int,
    block: int,
    q_out: torch.Tensor | None,
) -> torch.Tensor:
    """The fixed-point masses of a (rows, V) float32 CPU tensor with per-row cuts
    (:func:`detsample.arith.jit.cut_masses_rows`): written into ``q_out`` ((rows, V)
    int64) when given; returns their sums by blocks of ``block`` columns, (rows, nb)
    int64."""
    rows, V = z.shape
    a = z.contiguous().numpy()
    nb = -(-V // block) if V else 0
    sums = torch.empty((rows, nb), dtype=torch.int64)
    qo = q_out.numpy() if q_out is not None else _NO_Q
    t = tau.to(torch.float32).contiguous().numpy()
    lo = least.to(torch.float32).contiguous().numpy()
    k, so = jit().cut_masses_rows, sums.numpy()
    _run(lambda s, e: k(a, t, lo, _f32(floor), frac, block, qo, so, s, e), _chunks(rows, a.size))
    return sums


_NO_Q = np.empty((0, 0), dtype=np.int64)


def _f32(v: float) -> np.float32:
    return np.float32(v)
