"""Tests of detsample/enginechecks.py: the engine checks of ``detsample check`` hold on
the reference engine and fail, readably, under fault injection."""

from __future__ import annotations

import pytest
import torch

from detsample.checks import engine as enginechecks
from detsample.checks.faults import perturbed_sample
from detsample.golden import engine_scenarios as enginescenarios
from detsample.probe.threads import torch_threads

pytestmark = pytest.mark.skipif(
    not enginescenarios.available(), reason="detsample.refmodel.engine is not in this build"
)


def test_checks_registered():
    assert [f.__name__ for f in enginechecks.CHECKS] == [
        "engine_batch_invariance",
        "engine_prefill_decode_alignment",
        "engine_determinism",
    ]


@pytest.mark.parametrize("fn", enginechecks.CHECKS, ids=lambda f: f.__name__)
def test_check_holds(fn):
    r = fn(quick=True)
    assert r.ok, r.detail


def test_batch_invariance_break_detected():
    """Bug pinned: an engine whose rows depend on their neighbours."""
    with perturbed_sample(lambda b: len(b) > 1):
        r = enginechecks.engine_batch_invariance(quick=True)
    assert not r.ok and "[alone vs mixed]" in r.detail and "logprobs differ in bits" in r.detail


def test_alignment_break_detected():
    """Bug pinned: decode-time logprobs != prefill rescoring (vLLM's
    test_decode_logprobs_match_prefill_logprobs, SGLang's p_vs_d)."""
    with perturbed_sample(lambda b: not any(r.rid.startswith("rescore/") for r in b.requests)):
        r = enginechecks.engine_prefill_decode_alignment(quick=True)
    assert not r.ok and "prefill rescoring differs" in r.detail


def test_thread_break_detected():
    with torch_threads(2), perturbed_sample(lambda b: torch.get_num_threads() == 1):
        r = enginechecks.engine_determinism(quick=True)
    assert not r.ok and "[1 thread]" in r.detail
