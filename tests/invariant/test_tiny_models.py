"""The mode on real transformers models: hf-tiny-llama and hf-tiny-qwen2, float32.

Under ``load_model(name, batch_invariant=True)`` a position's logits are bitwise the same
alone or at any row of a padded batch of mixed lengths (left and right padding, prefill
and a decode step with mixed cache lengths), by decode with a KV cache or one prefill,
by chunked prefill, run to run, and at 1 and 2 threads. Without the mode, decode and
prefill differ (negative control), and the mode's logits stay within
:data:`LOGIT_BOUND` of the default kernels' (docs/batch-invariant.md).

Pins: any kernel of the two models that rounds a row by its batch, its padding, its
query length or the thread count.
"""

from __future__ import annotations

import pytest
import torch

from detsample.models import load_model
from detsample.probe.threads import torch_threads

MODELS = ["hf-tiny-llama", "hf-tiny-qwen2"]
PADDINGS = ["left", "right"]
THREADS = [1, 2]
PROMPT = 18
NEIGHBOURS = (5, 33, 1, 12)
CHUNKS = (5, 7, 1, 9)
LOGIT_BOUND = 1e-4  # measured: <= 1.1e-5 on both models (logits of magnitude ~10)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module", params=MODELS)
def name(request):
    return request.param


@pytest.fixture(scope="module")
def invariant(name):
    return load_model(name, batch_invariant=True)


@pytest.fixture(scope="module")
def default(name):
    return load_model(name)


def _prefill(m, seq):
    return m.forward([m.new_cache()], [seq])[0]


def _decode(m, seq):
    cache = m.new_cache()
    return torch.cat([m.forward([cache], [[t]])[0] for t in seq])


@pytest.mark.parametrize("threads", THREADS)
def test_prefill_decode_and_chunked_prefill_are_bitwise_equal(invariant, threads):
    seq = _tokens(PROMPT, 1)
    with torch_threads(threads):
        full = _prefill(invariant, seq)
        assert torch.equal(_decode(invariant, seq), full)
        cache, parts, i = invariant.new_cache(), [], 0
        for n in CHUNKS * 3:
            if i >= len(seq):
                break
            parts.append(invariant.forward([cache], [seq[i : i + n]])[0])
            i += n
        assert torch.equal(torch.cat(parts), full)
        assert torch.equal(_prefill(invariant, seq), full)  # run to run


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("padding", PADDINGS)
def test_a_row_is_the_same_alone_and_in_a_mixed_batch(invariant, padding, threads):
    m = invariant.with_padding(padding)
    seq = _tokens(PROMPT, 2)
    rows = [_tokens(n, 10 + n) for n in NEIGHBOURS]
    rows.insert(2, seq)
    with torch_threads(threads):
        alone_cache = m.new_cache()
        alone = m.forward([alone_cache], [seq])[0]
        caches = [m.new_cache() for _ in rows]
        assert torch.equal(m.forward(caches, rows)[2], alone)
        step = m.forward([alone_cache], [[7]])[0]
        steps = m.forward(caches, [[7 + i] if i != 2 else [7] for i in range(len(rows))])
        assert torch.equal(steps[2], step)


def test_without_the_mode_decode_differs_from_prefill(default):
    """Negative control: the same checks on the default kernels fail."""
    seq = _tokens(PROMPT, 1)
    with torch_threads(1):
        assert not torch.equal(_decode(default, seq), _prefill(default, seq))


def test_the_mode_stays_within_the_bound_of_the_default_kernels(invariant, default):
    seq = _tokens(40, 4)
    with torch_threads(1):
        pairs = [
            (_prefill(invariant, seq), _prefill(default, seq)),
            (_decode(invariant, seq[:10]), _decode(default, seq[:10])),
        ]
    for a, b in pairs:
        assert (a - b).abs().max().item() <= LOGIT_BOUND
        assert (torch.log_softmax(a, -1) - torch.log_softmax(b, -1)).abs().max().item() <= LOGIT_BOUND


def test_the_mode_is_scoped_to_the_adapters_forwards(invariant):
    from detsample.invariant import is_enabled

    _prefill(invariant, [1, 2, 3])
    assert not is_enabled()
    assert invariant.with_padding("right").batch_invariant


@pytest.mark.parametrize("threads", THREADS)
def test_bfloat16_models_are_invariant_too(name, threads):
    from detsample.models import HFCausalLM, build_tiny

    seq = _tokens(12, 5)
    with torch_threads(threads):
        m = HFCausalLM(build_tiny(name, dtype=torch.bfloat16), batch_invariant=True)
        full = _prefill(m, seq)
        assert torch.equal(_decode(m, seq), full)
        rows = [seq[:5], seq, seq[:9]]
        assert torch.equal(m.with_padding("left").forward([m.new_cache() for _ in rows], rows)[1], full)
        plain = HFCausalLM(build_tiny(name, dtype=torch.bfloat16))
        assert not torch.equal(_decode(plain, seq), _prefill(plain, seq))


def test_every_probe_check_holds_under_the_mode(invariant):
    """The probe's five checks (batch invariance with both paddings, prefill/decode,
    chunked prefill, run to run, 1 vs 2 threads), as ``detsample probe model NAME
    --batch-invariant`` runs them, on a shorter prompt."""
    from detsample.probe.model import ProbeConfig, probe_model

    report = probe_model(invariant, ProbeConfig(prompt_len=17, neighbours=(3, 21, 6), chunks=(3, 5)))
    assert report.ok, report.table()
