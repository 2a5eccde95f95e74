"""The architecture panel under the mode (tests/invariant/architectures.py): every listed
architecture bitwise, or refused by name.

For each: prefill == decode == chunked prefill == left- and right-padded batch, bitwise, at
1 and 2 threads (and the same bits at both), with the mode; the same checks fail without it
(negative control); the mode's logits within 1e-4 of the default kernels'; the MoE ones in
bfloat16 too. A linear-attention or state-space hybrid whose mixer the mode runs by its
recurrent update (gated delta-net: Qwen3-Next, Qwen3.5, Qwen3.5-MoE; Kimi delta attention:
Kimi-Linear; Mamba 2: Nemotron-H, Granite-4 hybrid, Bamba, Falcon-H1, Mamba2, Zamba2; Mamba: Jamba,
Mamba, FalconMamba; lightning attention: MiniMax) is checked bitwise through transformers'
own cache, both variants, with the mode's kernels alone (the mixer not covered) failing as
a negative control; MiniMax's chunked prefill, which transformers masks wrongly (its cache
reports the linear layer's empty key store as the past length), is correct and bitwise
under the mode (the cover reads the length from a layer holding keys), and raises in the
mode's attention without the cover. A row the mode cannot run (``Arch.refused``: Zamba)
raises RefusedLayerError at its first forward instead of returning variant logits -- by
name, and with the name list emptied by the state it keeps beyond keys and values (with a
cache and without one) -- while under the mode's kernels with the guard off some check
fails (negative control). LFM2 (short convolutions, whose cache keeps a verbatim window)
is checked bitwise through transformers' own cache, both variants.

Pins: an MoE combine or router that follows the batch (the grouped expert product was not
covered), an attention extra (soft-capping, sinks, MLA's value dim) that raised or was
dropped, a sliding window that moved logits, and a variant architecture run silently
(MiniMax's lightning attention, on no name list, did).

The default suite runs a representative subset; ``pytest -m panel tests/invariant`` runs
every architecture of the panel.
"""

from __future__ import annotations

import pytest
import torch

from detsample.invariant import batch_invariant, guard
from detsample.invariant.guard import RefusedLayerError
from detsample.models.base import ModelError, prefill
from detsample.models.hf import use_invariant_attention
from detsample.probe.threads import torch_threads
from tests.invariant.architectures import PANEL, adapter, build, failures, own_cache_failures, unguarded

DEFAULT = ("llama", "gemma2", "gpt2", "qwen3moe", "deepseekv3", "gptoss", "qwen35", "minimax", "lfm2", "nemotronh")
CASES = [pytest.param(a, id=a.name, marks=() if a.name in DEFAULT else pytest.mark.panel) for a in PANEL]
TOKENS = torch.randint(0, 512, (19,), generator=torch.Generator().manual_seed(11)).tolist()


def _refused(arch, model: torch.nn.Module, monkeypatch) -> None:
    """Refused at its first forward, by name and, with no name list, by the state it keeps
    (with a cache and without one); the adapter returns no logits either."""
    ids = torch.tensor([TOKENS])
    bad, _ = own_cache_failures(model, TOKENS, False, guarded=False)
    assert bad, f"{arch.name}: bitwise under the mode's kernels unguarded (no negative control)"
    with torch.no_grad(), batch_invariant(), pytest.raises(RefusedLayerError):
        model(ids)
    with pytest.raises((ModelError, RefusedLayerError)):  # the adapter returns no logits either
        prefill(adapter(build(arch), True), TOKENS)
    monkeypatch.setattr(guard, "REFUSED", ())
    for use_cache in (True, False):
        fresh = build(arch)
        with torch.no_grad(), batch_invariant(), pytest.raises(RefusedLayerError, match=arch.refused):
            fresh(ids, use_cache=use_cache)
        with torch.no_grad(), batch_invariant(), pytest.raises(RefusedLayerError):
            fresh(ids)  # and at every later forward


def _bitwise_through_own_cache(arch, model: torch.nn.Module) -> None:
    """A hybrid the adapter cannot run (its cache holds convolution windows or a recurrent
    state): the same checks through transformers' own cache, both variants, 1 and 2
    threads; a chunked prefill transformers gets wrong (``arch.unchunked``) is left out of
    the default kernels' checks and compared under the mode, whose cover corrects it
    (without the cover it raises inside the mode's attention)."""
    chunked = not arch.unchunked
    with torch_threads(2):
        bad_default, ref = own_cache_failures(model, TOKENS, None, chunked=chunked)
        assert bad_default, f"{arch.name}: the default kernels passed every check (no negative control)"
        if arch.covered:  # the mode's kernels alone do not do it: its mixer's recurrent form does
            assert own_cache_failures(model, TOKENS, False, guarded=False, chunked=chunked)[0], (
                f"{arch.name}: bitwise under the mode's kernels without its mixer covered"
            )
    use_invariant_attention(model)
    if not chunked:
        _chunked_prefill_raises_uncovered(model)
    for portable in (False, True):
        results = {}
        for threads in (1, 2):
            with torch_threads(threads):
                results[threads] = own_cache_failures(model, TOKENS, portable)
        assert not results[1][0] and not results[2][0], (
            f"{arch.name} portable={portable}: {results[1][0] + results[2][0]}"
        )
        assert torch.equal(results[1][1], results[2][1])
        assert (results[2][1] - ref).abs().max() < 1e-4


def _chunked_prefill_raises_uncovered(model: torch.nn.Module) -> None:
    """Negative control for the cover's cache fix (MiniMax): without it, a second chunk's
    attention mask leaves out the cached keys, an error in the mode's attention."""
    ids = torch.tensor([TOKENS])
    with torch.no_grad(), batch_invariant(), unguarded():
        cache = model(ids[:, :3], use_cache=True).past_key_values
        with pytest.raises(RuntimeError):
            model(ids[:, 3:10], past_key_values=cache, use_cache=True, position_ids=torch.arange(3, 10)[None])


@pytest.mark.parametrize("arch", CASES)
def test_bitwise_under_the_mode_or_refused(arch, monkeypatch):
    model = build(arch)
    if arch.refused:
        _refused(arch, model, monkeypatch)
        return
    if arch.own_cache:
        _bitwise_through_own_cache(arch, model)
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
