"""The portable mode's bits on this machine: the weights hash and the portable logits hash
of the tiny models tests/invariant runs, printed as one JSON line. tests/invariant/
test_portable_isa.py runs it under each ATen instruction set (``ATEN_CPU_CAPABILITY``) and
requires one hash for all; an emulation harness for another architecture (aarch64 under
QEMU) runs it there and compares with the x86 line.

    python -m tests.invariant.portable_hashes [--control] [MODEL ...]      (from the repo root)

Models: :data:`MODELS` (the tiny Llama and Qwen2 of tests/invariant/test_tiny_models.py,
test_portable.py's Llama shape, and the panel rows whose ops the others do not run:
GPT-2's tanh gelu and ``pow``, Gemma 2's soft-capping ``tanh`` and tanh gelu, GPT-NeoX's
erf gelu and partial rotary, Apertus's ``expm1`` / ``softplus``, DeepSeek-V3's sigmoid
router). The weights hash covers every parameter and buffer (a rotary ``inv_freq``
too); the logits are one portable prefill of :data:`TOKENS`.

``--control`` adds the negative controls for the first model, run in the same process:
its weights drawn by ``torch.randn`` with a seeded generator (as the models were built
before), and its portable logits with torch's own ``silu`` / ``sigmoid`` / ``cos`` / ``sin``
kernels in place of detsample's (ATen's ISA-dependent kernels, as the mode ran them
before). Under two ATen sets those must differ where the real ones agree.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from detsample.models import HFCausalLM, prefill
from detsample.models.tiny import build_tiny

TOKENS = [5, 300, 17, 42, 511, 0, 256, 99, 7, 128, 64, 3, 200, 450, 12, 77, 1, 333]
PANEL = ("gpt2", "gemma2", "gptneox", "apertus", "deepseekv3")
MODELS = ("hf-tiny-llama", "hf-tiny-qwen2", "h64-i96-4h") + PANEL


def build(name: str) -> torch.nn.Module:
    """The model ``name`` of :data:`MODELS`, as the tests build it."""
    if name.startswith("hf-tiny-"):
        return build_tiny(name)
    if name in PANEL:
        from tests.invariant.architectures import PANEL as ROWS
        from tests.invariant.architectures import build as build_arch

        return build_arch(next(a for a in ROWS if a.name == name))
    from tests.invariant.matrix_child import module

    return module(name)


def sha(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def weights_hash(model: torch.nn.Module) -> str:
    return sha([t for _, t in model.state_dict().items()])


def logits_hash(model: torch.nn.Module) -> str:
    lm = HFCausalLM(model, batch_invariant=True, portable=True)
    return sha([prefill(lm, TOKENS)])


def randn_init_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """The control: every parameter from one seeded ``torch.randn`` generator."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.05 * torch.randn(p.shape, generator=g, dtype=torch.float32))
    return model


@contextmanager
def aten_kernels() -> Iterator[None]:
    """The control: the portable mode's silu / sigmoid / cos / sin as ATen's kernels."""
    from detsample.invariant import cpu
    from detsample.ops.vector import pointwise

    aten = torch.ops.aten
    saved = dict(cpu._DEFINED)
    swap: dict[str, Callable] = {
        n: (lambda x, op=op: pointwise(op, x))
        for n, op in (
            ("silu", aten.silu.out),
            ("sigmoid", aten.sigmoid.out),
            ("cos", aten.cos.out),
            ("sin", aten.sin.out),
        )
    }
    cpu._DEFINED.update(swap)
    try:
        yield
    finally:
        cpu._DEFINED.clear()
        cpu._DEFINED.update(saved)


def hashes(names: list[str], control: bool) -> dict:
    out: dict = {"isa": torch.backends.cpu.get_cpu_capability(), "weights": {}, "logits": {}}
    if control:
        out["control"] = {"weights": {}, "logits": {}}
    for i, name in enumerate(names):
        model = build(name)
        out["weights"][name] = weights_hash(model)
        out["logits"][name] = logits_hash(model)
        if control and i == 0:
            with aten_kernels():
                out["control"]["logits"][name] = logits_hash(model)
            out["control"]["weights"][name] = weights_hash(randn_init_(build(name)))
    return out


def main(argv: list[str]) -> int:
    control = "--control" in argv
    names = [a for a in argv if a != "--control"] or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"unknown models {unknown}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    print(json.dumps(hashes(names, control)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
