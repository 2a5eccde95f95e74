"""Every golden scenario by name: the synthetic ones and the engine schedules.

:mod:`detsample.golden.scenarios` (synthetic logits) and
:mod:`detsample.golden.engine_scenarios` (the reference engine) each define scenarios;
this module is the one place that lists them all, so neither imports the other's registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from detsample.golden import engine_scenarios
from detsample.golden.format import ScenarioOutput
from detsample.golden.scenarios import SCENARIOS


def registry() -> dict[str, Any]:
    """Every registered scenario: the synthetic ones, plus the engine schedules of
    :mod:`detsample.golden.engine_scenarios` where the reference engine exists. Each has
    ``name``, ``quick`` and ``produce(sampler=None, device="cpu")``."""
    reg: dict[str, Any] = dict(SCENARIOS)
    if engine_scenarios.available():
        reg.update(engine_scenarios.ENGINE_SCENARIOS)
    return reg


def get(name: str) -> Any:
    """The registered scenario ``name`` (KeyError naming the known ones otherwise)."""
    reg = registry()
    try:
        return reg[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(sorted(reg))}") from None


def names(quick: bool = False, device: str | torch.device | None = None) -> list[str]:
    """Registered scenario names (the quick subset when ``quick``; those that run on
    ``device`` when given: a scenario may restrict itself with a ``devices`` tuple), sorted."""
    kind = None if device is None else torch.device(device).type
    return sorted(
        n
        for n, s in registry().items()
        if (s.quick or not quick) and (kind is None or kind in getattr(s, "devices", (kind,)))
    )


def produce_all(selected: Sequence[str], device: str | torch.device = "cpu") -> dict[str, ScenarioOutput]:
    """Canonical outputs of the ``selected`` scenarios (KeyError for an unknown name)."""
    return {n: get(n).produce(device=device) for n in selected}
