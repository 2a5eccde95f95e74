"""Shared fixtures of the reference-model tests."""

from __future__ import annotations

import pytest

from detsample.refmodel import RefModel, RefModelConfig
from tests.helpers import num_threads as _num_threads


@pytest.fixture
def num_threads():
    """Context-manager factory: ``with num_threads(2): ...`` (restored in finally)."""
    return _num_threads


@pytest.fixture(scope="session")
def model() -> RefModel:
    return RefModel(RefModelConfig())
