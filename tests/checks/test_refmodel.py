"""refmodel checks for ``detsample check``: pass on the model, fail loudly on a leak.

Bug pinned: a gate check that cannot fail, or fails without saying where.
"""

from __future__ import annotations

from detsample.checks.battery import external_checks
from detsample.checks.refmodel import CHECKS, refmodel_prefill_decode_logits
from tests.refmodel.test_verify import BatchLeakyModel


def test_passes_on_the_reference_model():
    r = refmodel_prefill_decode_logits(quick=True)
    assert r.ok, r.detail
    assert "bitwise" in r.detail


def test_fails_on_a_batch_leaky_model():
    r = refmodel_prefill_decode_logits(quick=True, model=BatchLeakyModel())
    assert not r.ok
    assert "position" in r.detail and "batches <= 9" in r.detail


def test_registered_with_the_battery():
    names = [n for n, _ in external_checks()]
    assert "refmodel_prefill_decode_logits" in names
    assert (refmodel_prefill_decode_logits,) == CHECKS
