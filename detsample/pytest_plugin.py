"""pytest plugin (entry point ``pytest11``): the ``--golden-update`` workflow.

``pytest --golden-update`` regenerates the golden files of this platform (see
docs/golden.md); tests read the flag through the ``golden_update`` fixture.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("detsample")
    group.addoption("--golden-update", action="store_true", default=False,
                    help="regenerate detsample golden files for this platform")
    group.addoption("--golden-force", action="store_true", default=False,
                    help="allow --golden-update when the CI variable is set")


@pytest.fixture
def golden_update(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--golden-update"))
