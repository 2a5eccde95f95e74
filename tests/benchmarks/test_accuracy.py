"""The portable kernels against float32 BLAS on a model with massive activations.

Pins: a portable product that loses bits on rows with massive activations (the
fixed-point product it replaced kept 21 bits below a row's largest magnitude: a model
with 300x channels had logits 12.6x further from float64 than torch's float32 kernels).
The model is built here (seeded weights; a few residual channels scaled); the claim:
the portable logits are at most as far from a float64 reference as the default
kernels', in the largest and in the median error.
"""

from __future__ import annotations

import pytest
import torch

from detsample.benchmarks import accuracy


@pytest.mark.parametrize("scale", [1, 300, 3000])
def test_portable_logits_are_at_least_as_accurate_as_the_default_kernels(scale):
    r = accuracy.errors(scale)
    if scale > 1:
        assert r.ratio > scale / 10  # the channels really are massive
    assert r.largest["portable"] <= r.largest["default"], r
    assert r.median["portable"] <= r.median["default"], r


def test_the_reference_is_not_the_model_itself():
    """Negative control: the errors are measured (a zero would mean the reference and
    the float32 model were one computation)."""
    r = accuracy.errors(30, tokens=8)
    assert all(v > 0 for v in r.largest.values())
    assert "portable max" in accuracy.table([r])
    assert torch.get_default_dtype() == torch.float32
