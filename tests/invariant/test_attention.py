"""The invariant attention: a query's output depends on its q and its keys only.

Pins: key blocks counted from the padded slot instead of the row's first key (left
padding moves every block boundary), a decode step that groups keys differently from a
prefill (CPU SDPA blocks by query length), a score that depends on a neighbour query
(product rows below 16), a longer neighbour's extra blocks leaking a rescale, and a
mask that loses a key. Correctness is checked against torch's SDPA within 1e-5.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from detsample.invariant import ATTENTION_NAME, attention, batch_invariant, register_attention
from detsample.invariant.attention import KEY_BLOCK
from detsample.threads import torch_threads

LENGTHS = [1, 2, 15, 16, 17, KEY_BLOCK - 1, KEY_BLOCK, KEY_BLOCK + 1, 2 * KEY_BLOCK + 3]
HEADS = [(4, 2), (5, 1), (3, 3)]


def _qkv(B, H, Hkv, T, L, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, D, generator=g), torch.randn(B, Hkv, L, D, generator=g),
            torch.randn(B, Hkv, L, D, generator=g))


def _sdpa(q, k, v, mask):
    G = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1),
                                          attn_mask=mask)


@pytest.mark.parametrize("h,hkv", HEADS)
def test_matches_sdpa(h, hkv):
    q, k, v = _qkv(2, h, hkv, 20, 20, D=24)
    causal = torch.ones(20, 20, dtype=torch.bool).tril()
    assert torch.allclose(attention(q, k, v), _sdpa(q, k, v, causal), atol=1e-5)
    pad = causal[None, None].repeat(2, 1, 1, 1)
    pad[1, :, :, :5] = False                                # row 1: 5 padding slots
    pad[1, :, :5, 5] = True                                 # pad queries see one key
    ref = _sdpa(q, k, v, pad)
    assert torch.allclose(attention(q, k, v, pad), ref, atol=1e-5)
    bias = torch.where(pad, torch.randn(pad.shape) * 0.1, torch.finfo(torch.float32).min)
    assert torch.allclose(attention(q, k, v, bias), _sdpa(q, k, v, bias), atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("h,hkv", HEADS)
def test_decode_equals_prefill_at_every_block_edge(h, hkv, threads):
    L = max(LENGTHS)
    q, k, v = _qkv(1, h, hkv, L, L, seed=1)
    with torch_threads(threads):
        prefill = attention(q, k, v)                              # causal, T = L
        for n in LENGTHS:
            step = attention(q[:, :, n - 1: n], k[:, :, :n], v[:, :, :n])
            assert torch.equal(step, prefill[:, :, n - 1: n]), n
            chunk = attention(q[:, :, n // 2: n], k[:, :, :n], v[:, :, :n])   # chunked prefill
            assert torch.equal(chunk, prefill[:, :, n // 2: n]), n


def _padded(k: torch.Tensor, left: int, right: int) -> torch.Tensor:
    B, H, L, D = k.shape
    out = torch.randn(B, H, left + L + right, D) * 100.0   # garbage in the padding slots
    out[:, :, left: left + L] = k
    return out


@pytest.mark.parametrize("threads", [1, 2])
def test_padding_batch_and_cache_length_do_not_matter(threads):
    """A sequence of n keys: alone, left-padded, right-padded, next to longer rows."""
    n, T = 70, 3
    q, k, v = _qkv(1, 4, 2, T, n, seed=2)
    causal = torch.ones(T, n, dtype=torch.bool).tril(n - T)
    with torch_threads(threads):
        alone = attention(q, k, v, causal[None, None])
        for left, right in [(5, 0), (0, 9), (40, 30), (130, 0)]:
            L = left + n + right
            mask = torch.zeros(2, 1, T, L, dtype=torch.bool)
            mask[0, 0, :, left: left + n] = causal
            mask[1, 0] = torch.ones(T, L, dtype=torch.bool).tril(L - T)   # a longer neighbour
            g = torch.Generator().manual_seed(left + right)
            qq = torch.cat([q, torch.randn(1, 4, T, 16, generator=g)])
            kk = torch.cat([_padded(k, left, right), torch.randn(1, 2, L, 16, generator=g)])
            vv = torch.cat([_padded(v, left, right), torch.randn(1, 2, L, 16, generator=g)])
            out = attention(qq, kk, vv, mask)
            assert torch.equal(out[:1], alone), (left, right)


def test_a_query_that_may_attend_nothing_outputs_zeros():
    q, k, v = _qkv(2, 2, 2, 3, 4, seed=3)
    mask = torch.ones(2, 1, 3, 4, dtype=torch.bool)
    mask[0, 0, 1] = False
    mask[1] = False
    out = attention(q, k, v, mask)
    assert torch.equal(out[0, :, 1], torch.zeros(2, 16)) and torch.equal(out[1], torch.zeros(2, 3, 16))
    assert torch.isfinite(out).all()


def test_reduced_precision_inputs_return_their_dtype():
    q, k, v = _qkv(1, 2, 1, 5, 5, seed=4)
    out = attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, attention(q.bfloat16().float(), k.bfloat16().float(),
                                      v.bfloat16().float()).bfloat16())


def test_bad_shapes_are_named():
    q, k, v = _qkv(1, 3, 2, 4, 4)
    with pytest.raises(ValueError, match="heads must divide"):
        attention(q, k, v)
    with pytest.raises(ValueError, match=r"\(B, H, T, D\)"):
        attention(q[0], k, v)
    with pytest.raises(ValueError, match="one head"):
        attention(*_qkv(1, 2, 2, 4, 4), torch.ones(1, 2, 4, 4, dtype=torch.bool))


def test_registered_with_transformers_by_name():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from detsample.models import build_tiny

    assert register_attention() and register_attention()     # idempotent
    assert ATTENTION_NAME in AttentionInterface._global_mapping
    assert ATTENTION_NAME in AttentionMaskInterface._global_mapping
    model = build_tiny("hf-tiny-qwen2")
    model.set_attn_implementation(ATTENTION_NAME)
    assert model.config._attn_implementation == ATTENTION_NAME
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        ours = model(input_ids=ids).logits
        model.set_attn_implementation("sdpa")
        ref = model(input_ids=ids).logits
    assert torch.allclose(ours, ref, atol=1e-4)


def test_the_mode_routes_torch_sdpa_to_the_invariant_attention():
    """F.scaled_dot_product_attention (transformers' "sdpa", models calling it directly)
    is covered too: torch's is_causal is top-left, a bool mask, GQA, 3-D inputs."""
    q, k, v = _qkv(2, 4, 2, 9, 9, seed=5)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    with batch_invariant():
        assert torch.equal(F.scaled_dot_product_attention(q, kr, vr, is_causal=True),
                           attention(q, kr, vr, causal))
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                           attention(q, k, v, causal))
        assert torch.equal(F.scaled_dot_product_attention(q, kr, vr, attn_mask=causal),
                           attention(q, kr, vr, causal))
        three = F.scaled_dot_product_attention(q[0], kr[0], vr[0], is_causal=True)
        assert torch.equal(three, attention(q[:1], kr[:1], vr[:1], causal)[0])
        step = F.scaled_dot_product_attention(q[:, :, 8:], kr, vr)        # decode: sees all keys
        assert torch.equal(step, F.scaled_dot_product_attention(q, kr, vr, is_causal=True)[:, :, 8:])
        with pytest.raises(Exception, match="dropout"):
            F.scaled_dot_product_attention(q, kr, vr, dropout_p=0.5)
    ref = F.scaled_dot_product_attention(q, kr, vr, is_causal=True)
    assert torch.allclose(attention(q, kr, vr, causal), ref, atol=1e-5)
