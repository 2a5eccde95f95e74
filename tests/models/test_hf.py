"""HFCausalLM: one padded forward for a ragged batch, cache gathered back per row.

Pins: a padding or position bug (a row attending to a neighbour's or a pad slot, RoPE
positions counted from the padded slot, a cache row gathered from the wrong slots). Such
a bug moves logits by O(1); the kernels' batch variance moves them by ~1e-6. So these
tests compare against the plain Hugging Face forward within 1e-4 (numerics), and the
bitwise claims live in the batch-invariant mode's tests. Hybrids (state beside keys and
values in their cache): tests/models/test_hybrid.py.
"""

from __future__ import annotations

import pytest
import torch

from detsample.models import HFCausalLM, ModelError, build_tiny, prefill

TOL = 1e-4
PADDINGS = ["left", "right"]


@pytest.fixture(scope="module")
def llama():
    return build_tiny("hf-tiny-llama")


def _plain(module, seq):
    with torch.no_grad():
        return module(input_ids=torch.tensor([seq])).logits[0]


def _close(a, b):
    return (a - b).abs().max().item() < TOL


@pytest.mark.parametrize("padding", PADDINGS)
def test_padded_batch_rows_match_the_plain_forward(llama, padding):
    m = HFCausalLM(llama, padding=padding)
    seqs = [[5, 6, 7], list(range(10, 40)), [300] * 11]
    outs = m.forward([m.new_cache() for _ in seqs], seqs)
    for s, o in zip(seqs, outs):
        assert o.shape == (len(s), 512) and o.dtype == torch.float32
        assert _close(o, _plain(llama, s))


@pytest.mark.parametrize("padding", PADDINGS)
def test_ragged_decode_with_mixed_cache_lengths(llama, padding):
    """Rows with different cached lengths decode together; each continues its own prefix."""
    m = HFCausalLM(llama, padding=padding)
    seqs = [list(range(3, 3 + n)) for n in (4, 17, 9)]
    caches = [m.new_cache() for _ in seqs]
    m.forward(caches, [s[:-2] for s in seqs])  # ragged prefill
    m.forward(caches, [[s[-2]] for s in seqs])  # decode, mixed cache lengths
    last = m.forward(caches, [[s[-1]] for s in seqs])
    for s, c, o in zip(seqs, caches, last):
        assert len(c) == len(s) and c.token_ids == s
        assert _close(o[0], _plain(llama, s)[-1])
        assert all(k.shape[2] == len(s) for k, _ in c.layers)


def test_chunked_prefill_continues_the_cache(llama):
    m = HFCausalLM(llama)
    seq = list(range(20, 61))
    c = m.new_cache()
    parts = [prefill(m, seq[a:b], c) for a, b in ((0, 16), (16, 33), (33, 41))]
    assert _close(torch.cat(parts), _plain(llama, seq))


def test_qwen2_with_biases_and_tied_embeddings():
    q = build_tiny("hf-tiny-qwen2")
    assert q.config.tie_word_embeddings and q.model.layers[0].self_attn.q_proj.bias is not None
    m = HFCausalLM(q, padding="right")
    seqs = [[1, 2, 3, 4, 5], [9] * 12]
    for s, o in zip(seqs, m.forward([m.new_cache(), m.new_cache()], seqs)):
        assert _close(o, _plain(q, s))


BAD_CALLS = [
    (lambda m: m.forward([m.new_cache()], [[]]), "chunks[0] must not be empty"),
    (lambda m: m.forward([m.new_cache()], [[512]]), "token id 512 outside [0, 512)"),
    (lambda m: m.forward([m.new_cache()], [[1], [2]]), "one entry per cache"),
    (lambda m: (lambda c: m.forward([c, c], [[1], [2]]))(m.new_cache()), "distinct"),
    (lambda m: m.forward([object()], [[1]]), "caches[0] must be an HFSeqCache"),
    (lambda m: HFCausalLM(m.module, padding="middle"), "padding must be one of"),
    (lambda m: HFCausalLM(object()), "Hugging Face causal LM"),
]


@pytest.mark.parametrize("call,message", BAD_CALLS)
def test_bad_input_is_named(llama, call, message):
    with pytest.raises(ModelError, match=message.replace("[", r"\[").replace(")", r"\)")):
        call(HFCausalLM(llama))


def test_a_step_that_admits_a_prompt_does_not_pad_the_decode_rows_to_it(llama):
    """The bug: a continuous-batching step with one arriving prompt ran every decode row
    over the prompt's positions (one padded forward of T = prompt length). Now the decode
    rows run in a forward of T = 1, the prompt in its own; under the mode each row's
    logits equal the row alone, bit for bit."""
    lm = HFCausalLM(llama, batch_invariant=True, portable=True)
    widths = []
    hook = lm.module.register_forward_pre_hook(
        lambda mod, args, kwargs: widths.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        decoding = [lm.new_cache() for _ in range(2)]
        lm.forward(decoding, [[5, 6, 7], [8, 9]])
        widths.clear()
        mixed = lm.forward([*decoding, lm.new_cache()], [[3], [4], list(range(10, 40))])
    finally:
        hook.remove()
    assert sorted(widths) == [(1, 30), (2, 1)]
    alone = [lm.forward([lm.new_cache()], [t])[0][-1] for t in ([5, 6, 7, 3], [8, 9, 4])]
    assert all(torch.equal(a.view(torch.int32), m[-1].view(torch.int32)) for a, m in zip(alone, mixed))
