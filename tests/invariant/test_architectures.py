"""The architecture panel under the mode (tests/invariant/architectures.py): every listed
architecture bitwise, or refused by name.

For each: prefill == decode == chunked prefill == left- and right-padded batch, bitwise, at
1 and 2 threads (and the same bits at both), with the mode; the same checks fail without it
(negative control); the mode's logits within 1e-4 of the default kernels'; the MoE ones in
bfloat16 too. A linear-attention hybrid raises RefusedLayerError at its first forward
instead of returning variant logits.

Pins: an MoE combine or router that follows the batch (the grouped expert product was not
covered), an attention extra (soft-capping, sinks, MLA's value dim) that raised or was
dropped, a sliding window that moved logits, and a variant architecture run silently.

The default suite runs a representative subset; ``pytest -m panel tests/invariant`` runs
every architecture of the panel.
"""

from __future__ import annotations

import pytest
import torch

from detsample.invariant import batch_invariant
from detsample.invariant.guard import RefusedLayerError
from detsample.probe.threads import torch_threads
from tests.invariant.architectures import PANEL, adapter, build, failures

DEFAULT = ("llama", "gemma2", "gpt2", "qwen3moe", "deepseekv3", "gptoss", "qwen3next")
CASES = [pytest.param(a, id=a.name, marks=() if a.name in DEFAULT else pytest.mark.panel)
         for a in PANEL]
TOKENS = torch.randint(0, 512, (19,), generator=torch.Generator().manual_seed(11)).tolist()


def _hf_decode_differs(model: torch.nn.Module) -> bool:
    """transformers' own cache (a hybrid needs its state cache): decode vs one prefill."""
    ids = torch.tensor([TOKENS])
    with torch.no_grad():
        full = model(ids).logits[0]
        out = model(ids[:, :1], use_cache=True)
        steps, past = [out.logits[0, -1]], out.past_key_values
        for t in range(1, ids.shape[1]):
            out = model(ids[:, t: t + 1], past_key_values=past, use_cache=True)
            steps.append(out.logits[0, -1])
            past = out.past_key_values
    return not torch.equal(torch.stack(steps), full)


@pytest.mark.parametrize("arch", CASES)
def test_bitwise_under_the_mode_or_refused_by_name(arch):
    model = build(arch)
    if arch.refused:
        assert _hf_decode_differs(model), f"{arch.name}: decode matched prefill (no negative control)"
        with torch.no_grad(), batch_invariant(), pytest.raises(RefusedLayerError, match=arch.model[:8]):
            model(torch.tensor([TOKENS]))
        with pytest.raises(RefusedLayerError):
            failures(adapter(model, True), TOKENS)
        return
    with torch_threads(2):
        bad_default, ref = failures(adapter(model, False), TOKENS)
    assert bad_default, f"{arch.name}: the default kernels passed every check (no negative control)"
    results = {}
    for threads in (1, 2):
        with torch_threads(threads):
            results[threads] = failures(adapter(model, True), TOKENS)
    assert not results[1][0] and not results[2][0], f"{arch.name}: {results[1][0] + results[2][0]}"
    assert torch.equal(results[1][1], results[2][1])
    assert (results[2][1] - ref).abs().max() < 1e-4
    if arch.moe:
        with torch_threads(2):
            bad, _ = failures(adapter(build(arch, dtype=torch.bfloat16), True), TOKENS)
        assert not bad, f"{arch.name} bfloat16: {bad}"
