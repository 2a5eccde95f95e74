"""Shared fixtures of the reference-model tests."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch

from detsample.refmodel import RefModel, RefModelConfig


@contextlib.contextmanager
def _num_threads(n: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)``, restoring the old count after."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@pytest.fixture
def num_threads():
    """Context-manager factory: ``with num_threads(2): ...``."""
    return _num_threads


@pytest.fixture(scope="session")
def model() -> RefModel:
    return RefModel(RefModelConfig())
