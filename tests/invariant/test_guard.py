"""Never silently variant: the coverage check at a model's first forward under the mode.

Pins: a model whose forward runs an op the mode does not cover (here ``erf`` and a float
``cumsum``) returning logits that may depend on the batch, with no error; an error that
does not name op, module and shapes; a retry that passes silently after the first error;
``strict=False`` raising instead of warning; a linear-attention layer running at all; and
a covered model paying the recorder on every forward.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from detsample.invariant import batch_invariant
from detsample.invariant.guard import GUARD, RefusedLayerError, UncoveredOpError, UncoveredOpWarning, findings


class Inner(torch.nn.Module):
    def forward(self, x):
        return torch.erf(x).cumsum(-1)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.block = Inner()

    def forward(self, x):
        return self.block(self.proj(x))


class Covered(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.silu(self.proj(x)).sum(-1)


class FakeGatedDeltaNet(torch.nn.Module):
    def forward(self, x):
        return x


def test_an_uncovered_op_is_a_named_error_at_the_first_forward_and_after():
    m, x = Model(), torch.randn(3, 8)
    with torch.no_grad(), batch_invariant():
        with pytest.raises(UncoveredOpError) as e:
            m(x)
        msg = str(e.value)
        assert "aten::erf in block [3x8]" in msg and "aten::cumsum in block" in msg
        assert "aten::addmm" not in msg  # covered ops are not listed
        with pytest.raises(UncoveredOpError):  # a retry does not pass silently
            m(x)
    assert [f.op for f in findings(m)] == ["aten::cumsum", "aten::erf"]


def test_strict_false_warns_and_runs():
    m, x = Model(), torch.randn(3, 8)
    with torch.no_grad(), batch_invariant(strict=False):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = m(x)
        assert out.shape == (3, 8)
        assert any(issubclass(r.category, UncoveredOpWarning) and "aten::erf" in str(r.message) for r in w)


def test_a_covered_model_is_checked_once():
    m, x = Covered(), torch.randn(3, 8)
    with torch.no_grad(), batch_invariant():
        m(x)
        assert findings(m) == []
        calls = []
        orig = GUARD._frame

        def counting():
            f = orig()
            calls.append(f["rec"])
            return f

        GUARD._frame = counting
        try:
            m(x)
        finally:
            del GUARD._frame
        assert calls and all(r is None for r in calls)  # no recorder on later forwards
    assert findings(Model()) is None  # never run under the mode


def test_linear_attention_layers_are_refused_by_name():
    m = Covered()
    m.mixer = FakeGatedDeltaNet()
    with torch.no_grad(), batch_invariant(), pytest.raises(RefusedLayerError, match="mixer .FakeGatedDeltaNet."):
        m(torch.randn(2, 8))


def test_outside_the_mode_nothing_is_checked():
    m = Model()
    with torch.no_grad():
        m(torch.randn(2, 8))
    assert findings(m) is None and not GUARD.handles


@pytest.mark.parametrize("name", ["nemotronh", "kimilinear", "falconmamba", "zamba2"])
def test_a_model_with_covered_mixers_is_decided_by_structure_not_by_name(name):
    """Pins the name lists where the structural check decides: the Mamba models' norms
    (``MambaRMSNormGated``, ``FalconMambaWeightlessRMSNorm``) and Kimi-Linear's MLA
    (``KimiLinearAttention``) were refused by name unless listed as exemptions
    (``NOT_MIXERS``); in a model with a covered mixer the guard decides by what they keep."""
    from detsample.invariant import guard
    from tests.invariant.architectures import BY_NAME, build

    model = build(BY_NAME[name])
    named = {
        type(m).__name__
        for m in model.modules()
        if any(f.lower() in type(m).__name__.lower() for f, _ in guard.REFUSED)
    }
    assert frozenset() == guard.NOT_MIXERS and named  # names a fragment matches
    assert guard.refused_layers(model) == []


def test_an_uncovered_mixer_at_a_covered_layer_is_refused_by_name():
    """Its state would pass as the covered mixer's (same layer index, same attribute), so
    the structural check cannot decide it: the name does."""
    from detsample.invariant.guard import refused_layers
    from tests.invariant.architectures import BY_NAME, build

    model = build(BY_NAME["nemotronh"])
    stray = type("StrayMambaMixer", (torch.nn.Module,), {})()
    stray.layer_idx = 0
    model.model.layers[0].stray = stray
    assert [r.split(":")[0] for r in refused_layers(model)] == ["model.layers.0.stray (StrayMambaMixer)"]
    stray.layer_idx = 1  # not a covered layer: the state decides
    assert refused_layers(model) == []
