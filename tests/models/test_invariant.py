"""BatchInvariantLM: a CausalLM whose forwards run under the batch-invariant mode.

Pins: a wrapper that forgets the mode on some path (with_padding, a second forward) or
hides what the probe needs of the inner adapter (module, padding).
"""

from __future__ import annotations

import torch

from detsample.invariant import is_enabled
from detsample.models import BatchInvariantLM, RefModelFloat, prefill


class _Spy:
    name, vocab_size, max_seq_len, padding = "spy", 4, None, "right"

    def __init__(self) -> None:
        self.modes: list[bool] = []

    def new_cache(self):
        return []

    def forward(self, caches, chunks):
        self.modes.append(is_enabled())
        return [torch.zeros(len(c), 4) for c in chunks]

    def with_padding(self, padding):
        s = _Spy()
        s.padding = padding
        return s


def test_forwards_run_under_the_mode_and_attributes_pass_through():
    spy = _Spy()
    m = BatchInvariantLM(spy)
    prefill(m, [1, 2])
    prefill(m, [3])
    assert spy.modes == [True, True] and not is_enabled()
    assert (m.name, m.vocab_size, m.max_seq_len, m.padding) == ("spy", 4, None, "right")
    left = m.with_padding("left")
    assert isinstance(left, BatchInvariantLM) and left.padding == "left"
    prefill(left, [1])
    assert left.inner.modes == [True]


def test_the_float_reference_model_becomes_invariant():
    """Its F.linear, mean and SDPA all go through the mode's kernels: decode == prefill,
    which fails on torch's own (tests/models/test_refmodel_float.py)."""
    m = BatchInvariantLM(RefModelFloat())
    seq = list(range(1, 20))
    full = prefill(m, seq)
    cache = m.new_cache()
    assert torch.equal(torch.cat([m.forward([cache], [[t]])[0] for t in seq]), full)
