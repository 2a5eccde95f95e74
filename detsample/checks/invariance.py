"""Invariance checks of one synthetic scenario (the guarantees of docs/guarantees.md).

Each function returns a list of failure reports (empty = the guarantee held), comparing
token ids and logprob *bits* through :func:`detsample.golden.diff.compare`:

- :func:`composition_failures` - every row alone, and all rows in a permuted, split-and-
  merged batch re-permuted by ``filter`` at every step, equal the canonical run;
- :func:`run_to_run_failures` - a fresh ``Sampler`` reproduces the canonical run;
- :func:`thread_failures` - 1 and 2 torch threads give the canonical bits;
- :func:`alignment_failures` - the sampling-time logprob equals ``compute_logprobs`` on
  the same logits and batch, for every row and mode (raw, scaled, processed).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from detsample.golden.diff import compare
from detsample.golden.format import ScenarioOutput, float_text
from detsample.golden.scenarios import Scenario
from detsample.probe.threads import torch_threads


def _diff(label: str, ref: ScenarioOutput, got: ScenarioOutput) -> list[str]:
    d = compare(label, ref, got)
    return [] if d.ok else [d.report()]


def composition_failures(sc: Scenario, ref: ScenarioOutput, device: str = "cpu") -> list[str]:
    """Rows alone and in a shuffled mixed batch must give ``ref``'s bits."""
    fails = []
    for row in range(sc.rows):
        alone = sc.run(order=[row], device=device)
        fails += _diff(f"{sc.name} [row {row} alone vs in batch]", ref.of_request(sc.rid(row)), alone)
    order = list(np.random.default_rng(sc.seed + 1).permutation(sc.rows))
    mixed = sc.run(order=order, split=max(1, sc.rows // 2), shuffle_steps=True, device=device)
    fails += _diff(f"{sc.name} [permuted, split+merged, filter-shuffled batch]", ref, mixed)
    return fails


def run_to_run_failures(sc: Scenario, ref: ScenarioOutput, device: str = "cpu") -> list[str]:
    """A second run with a fresh Sampler must give ``ref``'s bits."""
    from detsample.sampler import Sampler

    return _diff(f"{sc.name} [second run]", ref, sc.run(sampler=Sampler(), device=device))


def thread_failures(
    sc: Scenario, ref: ScenarioOutput, device: str = "cpu", counts: tuple[int, ...] = (1, 2)
) -> list[str]:
    """Runs at each torch thread count in ``counts`` must give ``ref``'s bits."""
    fails = []
    for n in counts:
        with torch_threads(n):
            fails += _diff(f"{sc.name} [{n} thread(s)]", ref, sc.run(device=device))
    return fails


def alignment_failures(sc: Scenario, device: str = "cpu") -> list[str]:
    """Sample-time logprobs must equal ``Sampler.compute_logprobs`` bitwise."""
    from detsample.sampler import Sampler

    sampler = Sampler()
    fails: list[str] = []

    def hook(step: int, rows: list[int], logits: torch.Tensor, batch: Any, positions: torch.Tensor, out: Any) -> None:
        tok = out.token_ids
        valid = tok >= 0
        rescored = sampler.compute_logprobs(logits, batch, torch.where(valid, tok, torch.zeros_like(tok)))
        a = out.logprobs.cpu().numpy().view(np.uint32)
        b = rescored.cpu().numpy().view(np.uint32)
        for j in np.flatnonzero((a != b) & valid.cpu().numpy()).tolist():
            p = batch.params[j]
            fails.append(
                f"{sc.name}: request {sc.rid(rows[j])} position {int(positions[j])} step {step} "
                f"mode {p.logprobs_mode}: sample() logprob 0x{int(a[j]):08x} "
                f"({float_text(int(a[j]))}) != compute_logprobs 0x{int(b[j]):08x} "
                f"({float_text(int(b[j]))}) for token {int(tok[j])}"
            )

    sc.run(sampler=sampler, device=device, on_step=hook)
    return fails
