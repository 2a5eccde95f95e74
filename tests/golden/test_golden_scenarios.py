"""Every registered scenario against this platform's golden files, bit for bit.

``python -m pytest --golden-update tests/golden/test_golden_scenarios.py`` regenerates them
(docs/golden.md). A platform without goldens is a loud skip, never a pass.
"""

from __future__ import annotations

import pytest

from detsample.golden import registry

NAMES = registry.names()


@pytest.mark.parametrize("name", NAMES)
def test_scenario_matches_golden(name, golden):
    """Bug pinned: any kernel/op change that moves one bit of a token or logprob."""
    golden.check(name, registry.get(name).produce())
