"""Localisation: the first module and aten op where two forwards part ways
(detsample/probe/localize.py).

Pins: naming a module that runs after the real culprit (hooks fire at module exit, so a
parent or a later sibling), comparing a head's slice with a position's slice when sizes
coincide (5 heads and 5 tokens: a bogus divergence of billions of ulp), recording the
recorder's own clones as model ops, or leaving hooks installed after the run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from detsample.probe.localize import Side, first_divergence, select

D = 16


class Drift(nn.Module):
    """Adds 2**-20 to every element when the batch holds more than one row: a known
    batch-size-dependent op (an aten::add), on any machine."""

    def forward(self, x):
        return x + (2.0**-20 if x.shape[0] > 1 else 0.0)


class Block(nn.Module):
    def __init__(self, drift: bool):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.norm = nn.LayerNorm(D)
        self.drift = Drift() if drift else nn.Identity()
        self.proj = nn.Linear(D, D, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(D, D, generator=g) / 4)

    def forward(self, x):
        return x + self.proj(self.drift(self.norm(x)))


class Toy(nn.Module):
    def __init__(self, drift_in: int | None):
        super().__init__()
        self.layers = nn.ModuleList(Block(i == drift_in) for i in range(3))

    def forward(self, x):  # x: (B, T, D)
        for layer in self.layers:
            x = layer(x)
        return x


def _sides(model: nn.Module, rows: int, width: int = 6):
    x = torch.randn(rows, width, D, generator=torch.Generator().manual_seed(0))
    return (Side(lambda: model(x[:1]), 0, 2, 1, width), Side(lambda: model(x), 0, 2, rows, width))


def test_names_the_module_and_op_that_drift():
    """Layer 0 drifts (before any matmul, whose own batch variance depends on the CPU);
    its parent block and the later layers differ too, but run later."""
    model = Toy(drift_in=0).eval()
    div = first_divergence(*_sides(model, rows=3), module=model, root="toy")
    assert div is not None
    assert (div.module, div.op) == ("layers.0.drift", "aten::add")
    assert div.shapes == "[1,6,16] vs [3,6,16]" and div.max_ulp >= 1
    assert div.describe().startswith("first divergence: layers.0.drift -> aten::add [1,6,16] vs")


def test_no_divergence_and_hooks_removed():
    model = Toy(drift_in=None).eval()
    a, b = _sides(model, rows=1)
    assert first_divergence(a, a, module=model) is None
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_ops_outside_modules_are_named_by_root():
    """A model without nn.Modules (a function): ops are attributed to ``root``."""
    w = torch.randn(D, D, generator=torch.Generator().manual_seed(1))

    def f(x):
        return torch.tanh(x * w[0]) + (1e-3 if x.shape[0] > 2 else 0.0)  # element-wise: exact

    x = torch.randn(4, D, generator=torch.Generator().manual_seed(2))
    div = first_divergence(Side(lambda: f(x[:1]), 0, 0, 1, 1), Side(lambda: f(x), 0, 0, 4, 1), root="fn")
    assert div is not None and div.module == "fn" and div.op == "aten::add"


HEAD_CASES = [
    # (shape, side: batch, width, row, col) -> layouts admitted
    ((2, 5, 8), (2, 5, 1, 3), {"bt"}),
    ((2, 4, 5, 8), (2, 5, 1, 3), {"bht"}),
    ((10, 8), (2, 5, 1, 3), {"flat"}),
    ((1, 5, 5, 8), (1, 5, 0, 1), {"bt", "bht"}),  # 5 heads, 5 tokens: ambiguous
    ((3, 7), (2, 5, 0, 0), set()),
]


def test_select_layouts():
    for shape, (B, T, b, c), layouts in HEAD_CASES:
        t = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
        got = select(t, Side(lambda: None, b, c, B, T))
        assert set(got) == layouts, shape
    t = torch.arange(2 * 4 * 5 * 8.0).reshape(2, 4, 5, 8)
    assert torch.equal(select(t, Side(lambda: None, 1, 3, 2, 5))["bht"], t[1, :, 3])


def test_coinciding_sizes_do_not_make_a_bogus_divergence():
    """Per-head rotation with 5 heads: a 5-token chunk vs a 40-token prefill of the same
    values agree in the probed position; only the layout the 40-token side admits
    ((batch, heads, tokens, dim)) is compared."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 5, 40, 8, generator=g)
    scale = torch.randn(1, 1, 40, 8, generator=g)

    def f(n):
        return lambda: F.gelu(q[:, :, :n] * scale[:, :, :n])

    assert first_divergence(Side(f(5), 0, 1, 1, 5), Side(f(40), 0, 1, 1, 40)) is None
