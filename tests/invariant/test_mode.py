"""The mode switch: scoped, nested, restored on exit and on exceptions, nothing at import.

Pins: overrides that stay installed after the block (every later matmul in the process
silently changes), an exception that skips the restore, an inner block that uninstalls
the outer one's kernels, and an ``import detsample`` that already overrides aten.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import detsample
from detsample.invariant import OVERRIDES, batch_invariant, disable, enable, is_enabled

OPS = sorted(o.op for o in OVERRIDES)


def _ours(op: str) -> bool:
    """Whether aten::op's CPU kernel is one the mode registered."""
    dump = torch._C._dispatch_dump(f"aten::{op}")
    cpu = [line for line in dump.splitlines() if line.startswith("CPU:")]
    return any("detsample" in line for line in cpu)


def _variant_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 256, generator=g), torch.randn(688, 256, generator=g)


def test_the_overrides_are_installed_only_inside_the_block():
    assert not is_enabled() and not any(_ours(op) for op in OPS)
    with detsample.batch_invariant():
        assert is_enabled()
        assert all(_ours(op) for op in OPS), [op for op in OPS if not _ours(op)]
    assert not is_enabled() and not any(_ours(op) for op in OPS)


def test_inside_the_mode_a_linear_row_does_not_depend_on_the_batch():
    x, w = _variant_inputs()
    with batch_invariant():
        alone = F.linear(x[:1], w)
        assert all(torch.equal(F.linear(x[:m], w)[:1], alone) for m in (2, 3, 4, 5, 16))


def test_restored_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with batch_invariant():
            assert is_enabled()
            1 / 0
    assert not is_enabled() and not any(_ours(op) for op in OPS)


def test_nesting_keeps_the_outer_block_invariant():
    with batch_invariant():
        with batch_invariant():
            assert _ours("mm")
        assert is_enabled() and _ours("mm")
        try:
            with batch_invariant():
                raise KeyError("inner")
        except KeyError:
            pass
        assert _ours("mm")
    assert not _ours("mm")


def test_enable_disable_pairs_and_a_stray_disable_is_an_error():
    enable()
    enable()
    try:
        disable()
        assert is_enabled()
    finally:
        disable()
    assert not is_enabled()
    with pytest.raises(RuntimeError, match="without a matching enable"):
        disable()
    assert detsample.batch_invariant.enable is enable
    assert detsample.enable is enable and detsample.disable is disable


def test_importing_detsample_installs_nothing():
    """No kernel registered and no attention registered with transformers (whether or not
    some installed package imported transformers along the way)."""
    code = ("import sys, torch, detsample, detsample.invariant, detsample.models\n"
            "dump = torch._C._dispatch_dump('aten::mm')\n"
            "assert 'detsample' not in dump, dump\n"
            "if 'transformers' in sys.modules:\n"
            "    from transformers import AttentionInterface\n"
            "    assert 'detsample' not in AttentionInterface()\n")
    subprocess.run([sys.executable, "-c", code], check=True)
