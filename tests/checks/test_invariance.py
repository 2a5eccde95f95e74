"""Tests of detsample/invariance.py: each check passes on the real sampler and reports a
readable failure when the matching guarantee is broken by fault injection."""

from __future__ import annotations

import torch

from detsample.checks import invariance
from detsample.checks.faults import perturbed_compute_logprobs, perturbed_sample
from detsample.golden.scenarios import Scenario
from detsample.probe.threads import torch_threads

SC = Scenario("t.combo", "random", "combo", vocab=80, rows=4, steps=2, seed=5)


def test_all_hold_on_the_real_sampler():
    ref = SC.produce()
    assert invariance.composition_failures(SC, ref) == []
    assert invariance.run_to_run_failures(SC, ref) == []
    assert invariance.thread_failures(SC, ref) == []
    assert invariance.alignment_failures(SC) == []


def test_composition_break_detected():
    """Bug pinned: a result depending on the batch size (row alone != row in batch)."""
    ref = SC.produce()
    with perturbed_sample(lambda b: len(b) == 1):
        fails = invariance.composition_failures(SC, ref)
    assert len(fails) == SC.rows  # every row alone moved; the mixed batch did not
    assert "[row 0 alone vs in batch]" in fails[0] and "first divergence: request r0" in fails[0]


def test_thread_break_detected():
    with torch_threads(2):
        ref = SC.produce()
        with perturbed_sample(lambda b: torch.get_num_threads() == 1):
            fails = invariance.thread_failures(SC, ref)
    assert len(fails) == 1 and "[1 thread(s)]" in fails[0]


def test_alignment_break_detected():
    """Bug pinned: the rescoring path rounding differently from the sampling path."""
    with perturbed_compute_logprobs():
        fails = invariance.alignment_failures(SC)
    assert len(fails) == SC.steps  # row 0 of every step
    assert "!= compute_logprobs" in fails[0] and "request r0" in fails[0]


def test_run_to_run_break_detected():
    ref = SC.produce()
    with perturbed_sample(rid="r3"):
        fails = invariance.run_to_run_failures(SC, ref)
    assert len(fails) == 1 and "request r3" in fails[0]
