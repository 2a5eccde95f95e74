"""The mode switch: scoped, nested, restored on exit and on exceptions, nothing at import.

Pins: overrides that stay installed after the block (every later matmul in the process
silently changes), an exception that skips the restore, an inner block that uninstalls
the outer one's kernels, and an ``import detsample`` that already overrides aten.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import detsample
from detsample.invariant import OVERRIDES, batch_invariant, disable, enable, is_enabled

OPS = sorted(o.op for o in OVERRIDES)
ROOT = Path(__file__).resolve().parents[2]


def _cpu_kernel(op: str) -> str:
    """The active CPU kernel's registration line of aten::op in torch's dispatcher."""
    dump = torch._C._dispatch_dump(f"aten::{op}")
    return next((line for line in dump.splitlines() if line.startswith("CPU:")), "")


assert not is_enabled()
#: torch's own CPU kernels, as registered before any block of this module ran
TORCH_KERNELS = {op: _cpu_kernel(op) for op in OPS}


def _ours(op: str) -> bool:
    """Whether aten::op's active CPU kernel is another registration than torch's own
    (compared by registration, not by a file name: a checkout or virtualenv whose path
    holds the word "detsample" must not look like an override)."""
    return _cpu_kernel(op) != TORCH_KERNELS[op]


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
    with pytest.raises(ZeroDivisionError), batch_invariant():
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
    some installed package imported transformers along the way). Bug pinned: the check
    looked for the word "detsample" in the dispatcher's dump, which prints file paths,
    so it failed in any checkout or virtualenv whose path holds that word; it now
    compares every overridden op's registrations before and after the import."""
    code = (
        "import sys, torch\n"
        f"ops = {OPS!r}\n"
        "dump = lambda: [torch._C._dispatch_dump('aten::' + op) for op in ops]\n"
        "before = dump()\n"
        "import detsample, detsample.invariant, detsample.models\n"
        "assert dump() == before, 'importing detsample registered an aten kernel'\n"
        "if 'transformers' in sys.modules:\n"
        "    from transformers import AttentionInterface\n"
        "    name = detsample.invariant.ATTENTION_NAME\n"
        "    assert name not in AttentionInterface(), 'attention registered'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _doc_snippet(doc: str, index: int) -> str:
    """The ``index``-th python code block of docs/``doc``, as written."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / doc).read_text(), re.S)
    return blocks[index]


def test_the_docs_first_snippet_runs_in_a_fresh_process():
    """docs/batch-invariant.md's first snippet, as written, after a preamble that only
    defines ``model``, ``input_ids`` and ``mask`` (a tiny transformers Llama). Bug pinned:
    the snippet called ``model.set_attn_implementation("detsample")`` before anything had
    registered that attention, which raises in a fresh process."""
    pytest.importorskip("transformers")
    preamble = (
        "import torch\n"
        "from detsample.models.tiny import build_tiny\n"
        "model = build_tiny('hf-tiny-llama')\n"
        "input_ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])\n"
        "mask = torch.ones_like(input_ids)\n"
    )
    check = "\nassert logits.shape == (2, 4, 512) and bool(torch.isfinite(logits).all())\n"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    run = subprocess.run(
        [sys.executable, "-c", preamble + _doc_snippet("batch-invariant.md", 0) + check],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
