"""detsample.models.digest: the weights' content hash names the weights, not their path."""

from __future__ import annotations

import torch

from detsample.models import load_model
from detsample.models.digest import weights_digest


def test_same_weights_same_digest_and_one_changed_bit_another():
    a, b = load_model("hf-tiny-llama"), load_model("hf-tiny-llama")
    assert weights_digest(a) == weights_digest(b) and weights_digest(a).startswith("sha256:")
    w = next(b.module.parameters())
    with torch.no_grad():
        bits = w.view(torch.int32)
        bits.view(-1)[7] ^= 1  # one bit of one weight
    assert weights_digest(a) != weights_digest(b)


def test_the_reference_model_and_plain_modules_are_hashed_and_others_are_not():
    assert weights_digest(load_model("refmodel")).startswith("sha256:")
    assert weights_digest(torch.nn.Linear(2, 2)).startswith("sha256:")
    assert weights_digest(object()) is None
