"""Fixtures of the kernel tests: the interpreter worker, and CUDA for ``gpu`` tests."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.kernels.worker import Worker

HAVE_TRITON = importlib.util.find_spec("triton") is not None


@pytest.fixture(scope="session")
def interp():
    """Call ``interp(fn, *args)`` to run ``fn`` in the TRITON_INTERPRET=1 worker."""
    if not HAVE_TRITON:
        pytest.skip("triton is not installed")
    worker = Worker()
    try:
        yield worker
    finally:
        worker.close()


@pytest.fixture
def cuda():
    """The CUDA device for ``gpu`` tests (skipped, with the reason, without one)."""
    if not HAVE_TRITON:
        pytest.skip("triton is not installed")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)")
    return torch.device("cuda")
