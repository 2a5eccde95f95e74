"""Derived forms of weights (contiguous copies, upcasts, fixed point), kept beside the
parameter.

Pins: a form recomputed at every call (a pass over the weight per token: the grouped
expert products' slices, made inside a kernel where views do not record their base, missed
the cache), a stale form served after an in-place update of the weight, and an activation
(not a parameter) cached.
"""

from __future__ import annotations

import torch

from detsample.invariant import batch_invariant, exact
from detsample.invariant.weights import derived


def _counting():
    calls = []

    def make(x):
        calls.append(1)
        return x.contiguous()

    return calls, make


def test_a_parameter_view_is_converted_once_per_version():
    p = torch.nn.Parameter(torch.randn(6, 4))
    calls, make = _counting()
    a = derived(p.t(), "f", make)
    assert derived(p.t(), "f", make) is a and len(calls) == 1
    with torch.no_grad():
        p.add_(1.0)
    b = derived(p.t(), "f", make)
    assert len(calls) == 2 and torch.equal(b, p.detach().t().contiguous())
    x = torch.randn(6, 4)
    derived(x.t(), "f", make)
    derived(x.t(), "f", make)
    assert len(calls) == 4  # activations: never cached


def test_slices_named_with_their_parameter_are_cached_and_others_refused():
    p = torch.nn.Parameter(torch.randn(3, 5, 4))
    calls, make = _counting()
    s = p.detach()[1]  # no recorded base
    derived(s, "f", make, p)
    derived(p.detach()[1], "f", make, p)
    assert len(calls) == 1
    other = torch.randn(5, 4)
    derived(other, "f", make, p)  # not in p's storage
    derived(other, "f", make, p)
    assert len(calls) == 3


def test_the_grouped_expert_products_convert_each_expert_once(monkeypatch):
    w = torch.nn.Parameter(torch.randn(4, 8, 6))
    seen = []
    real = exact.prepare_b
    monkeypatch.setattr(exact, "prepare_b", lambda b: seen.append(1) or real(b))
    offs = torch.tensor([2, 4, 6, 8], dtype=torch.int32)
    with torch.no_grad(), batch_invariant(portable=True):
        for _ in range(3):
            torch._grouped_mm(torch.randn(8, 6), w.transpose(-2, -1), offs=offs)
    assert len(seen) == 4  # one per expert, not per call
