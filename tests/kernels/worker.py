"""The Triton interpreter worker of the kernel tests.

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, and ``triton.language``
decorates its own helpers (``tl.philox``, ``tl.sum``...) when triton is first imported,
so the flag must be set before ``import triton`` in a process. The kernel tests
therefore run their kernel calls in ONE spawned worker process that sets the flag before
anything imports triton; the pytest process itself keeps its environment and its
imports untouched (no global state leaks into other tests). On a CUDA machine the
``gpu`` tests call the same functions in-process on CUDA tensors instead.

:func:`fixed_order_dot` replaces the interpreter's ``tl.dot`` in the worker. The
interpreter computes ``tl.dot`` with ``numpy.matmul``, i.e. BLAS, whose micro-kernels
give an element a different summation order depending on its row's POSITION inside the
tile (OpenBLAS sgemm: rows at some offsets of a tile round differently), which is not
how a GPU's MMA behaves and would make the row-invariance tests test BLAS instead of the
kernels. The replacement accumulates ``acc + a[:, k] * b[k, :]`` for k ascending in
float32: every element of a tile sees the same sequence of operations, which is the
property the GPU's MMA gives each row, so the tests check the kernels' own structure
(fixed tiles, no split-K, masks, tile assignment). The real MMA is checked by the
``gpu`` tests.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os

import numpy as np


def fixed_order_dot(self, a, b, d, input_precision=None, max_num_imprecise_acc=None):
    """Interpreter ``create_dot``: float32 ``d + a @ b``, k ascending, per element."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def f32(h):
        if h.dtype.scalar == tl.bfloat16:  # the interpreter stores bfloat16 as uint16 bits
            return (h.data.astype(np.uint32) << 16).view(np.float32)
        return h.data.astype(np.float32)

    A, B = f32(a), f32(b)
    acc = d.data.astype(np.float32)
    for k in range(A.shape[-1]):
        acc = acc + A[..., :, k : k + 1] * B[..., k : k + 1, :]
    return TensorHandle(acc.astype(np.float32), d.dtype.scalar)


def init_worker() -> None:
    """Runs first in the worker: interpreter mode before triton is imported."""
    os.environ["TRITON_INTERPRET"] = "1"
    from triton.runtime.interpreter import InterpreterBuilder

    InterpreterBuilder.create_dot = fixed_order_dot


class Worker:
    """One spawned interpreter process; ``worker(fn, *args)`` runs ``fn`` there (``fn``
    must be a module-level function, its arguments and result picklable)."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=init_worker
        )

    def __call__(self, fn, *args, **kwargs):
        return self._pool.submit(fn, *args, **kwargs).result(timeout=900)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
