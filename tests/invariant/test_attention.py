"""The invariant attention: a query's output depends on its q and its keys only.

Pins: key blocks counted from the padded slot instead of the row's first key (left
padding moves every block boundary), a decode step that groups keys differently from a
prefill (CPU SDPA blocks by query length), a score that depends on a neighbour query
(product rows below 16), a longer neighbour's extra blocks leaking a rescale, and a
mask that loses a key. Correctness is checked against torch's SDPA within 1e-5.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.invariant import ATTENTION_NAME, attention, batch_invariant, register_attention
from detsample.invariant.attention import KEY_BLOCK
from detsample.probe.threads import torch_threads

LENGTHS = [1, 2, 15, 16, 17, KEY_BLOCK - 1, KEY_BLOCK, KEY_BLOCK + 1, 2 * KEY_BLOCK + 3]
HEADS = [(4, 2), (5, 1), (3, 3)]


def _qkv(B, H, Hkv, T, L, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, T, D, generator=g),
        torch.randn(B, Hkv, L, D, generator=g),
        torch.randn(B, Hkv, L, D, generator=g),
    )


def _sdpa(q, k, v, mask):
    G = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1), attn_mask=mask)


@pytest.mark.parametrize("h,hkv", HEADS)
def test_matches_sdpa(h, hkv):
    q, k, v = _qkv(2, h, hkv, 20, 20, D=24)
    causal = torch.ones(20, 20, dtype=torch.bool).tril()
    assert torch.allclose(attention(q, k, v), _sdpa(q, k, v, causal), atol=1e-5)
    pad = causal[None, None].repeat(2, 1, 1, 1)
    pad[1, :, :, :5] = False  # row 1: 5 padding slots
    pad[1, :, :5, 5] = True  # pad queries see one key
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
        prefill = attention(q, k, v)  # causal, T = L
        for n in LENGTHS:
            step = attention(q[:, :, n - 1 : n], k[:, :, :n], v[:, :, :n])
            assert torch.equal(step, prefill[:, :, n - 1 : n]), n
            chunk = attention(q[:, :, n // 2 : n], k[:, :, :n], v[:, :, :n])  # chunked prefill
            assert torch.equal(chunk, prefill[:, :, n // 2 : n]), n


def _padded(k: torch.Tensor, left: int, right: int) -> torch.Tensor:
    B, H, L, D = k.shape
    out = torch.randn(B, H, left + L + right, D) * 100.0  # garbage in the padding slots
    out[:, :, left : left + L] = k
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
            mask[0, 0, :, left : left + n] = causal
            mask[1, 0] = torch.ones(T, L, dtype=torch.bool).tril(L - T)  # a longer neighbour
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
    assert torch.equal(out, attention(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float()).bfloat16())


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

    assert register_attention() and register_attention()  # idempotent
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
        assert torch.equal(F.scaled_dot_product_attention(q, kr, vr, is_causal=True), attention(q, kr, vr, causal))
        assert torch.equal(
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), attention(q, k, v, causal)
        )
        assert torch.equal(F.scaled_dot_product_attention(q, kr, vr, attn_mask=causal), attention(q, kr, vr, causal))
        three = F.scaled_dot_product_attention(q[0], kr[0], vr[0], is_causal=True)
        assert torch.equal(three, attention(q[:1], kr[:1], vr[:1], causal)[0])
        step = F.scaled_dot_product_attention(q[:, :, 8:], kr, vr)  # decode: sees all keys
        assert torch.equal(step, F.scaled_dot_product_attention(q, kr, vr, is_causal=True)[:, :, 8:])
        with pytest.raises(Exception, match="dropout"):
            F.scaled_dot_product_attention(q, kr, vr, dropout_p=0.5)
    ref = F.scaled_dot_product_attention(q, kr, vr, is_causal=True)
    assert torch.allclose(attention(q, kr, vr, causal), ref, atol=1e-5)


def _grads(fn, q, k, v, seed=9):
    """fn's output bits and the gradients of a random weighting of it."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    (out * w).sum().backward()
    return out.detach(), [t.grad for t in leaves]


def _masks(B, T, L):
    causal = torch.ones(T, L, dtype=torch.bool).tril(L - T)
    pad = causal[None, None].repeat(B, 1, 1, 1)
    pad[-1, :, :, :3] = False  # the last row: 3 padding slots
    pad[-1, :, :, 3] |= torch.arange(T) < 3  # its first queries see one key
    bias = torch.where(
        pad, torch.randn(pad.shape, generator=torch.Generator().manual_seed(2)), torch.finfo(torch.float32).min
    )
    return {"causal": None, "padded": pad, "additive": bias}


@pytest.mark.parametrize("mask_kind", ["causal", "padded", "additive"])
@pytest.mark.parametrize("h,hkv", HEADS)
def test_differentiable_with_the_same_forward_bits(h, hkv, mask_kind):
    """A trainer's forward records autograd: the attention used to call out= kernels
    (``bmm(): functions with out=... don't support automatic differentiation``). Now the
    forward is the same bits with and without autograd, and the gradients are those of
    the same softmax attention computed by torch's SDPA (GQA groups summed)."""
    B, T, L = 2, 7, 7 + 2 * KEY_BLOCK // 3
    q, k, v = _qkv(B, h, hkv, T, L, D=24, seed=6)
    mask = _masks(B, T, L)[mask_kind]
    with torch.no_grad():
        plain = attention(q, k, v, mask)
    out, grads = _grads(lambda a, b, c: attention(a, b, c, mask), q, k, v)
    assert torch.equal(out, plain)
    ref_mask = torch.ones(T, L, dtype=torch.bool).tril(L - T) if mask is None else mask
    ref_out, ref = _grads(lambda a, b, c: _sdpa(a, b, c, ref_mask), q, k, v)
    assert torch.allclose(out, ref_out, atol=1e-5)
    for ours, theirs in zip(grads, ref):
        assert ours.shape == theirs.shape
        assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4)


def test_queries_that_may_attend_nothing_get_zero_gradients():
    q, k, v = _qkv(2, 2, 1, 3, 4, seed=3)
    mask = torch.ones(2, 1, 3, 4, dtype=torch.bool)
    mask[0, 0, 1] = False
    mask[1] = False
    _, (dq, dk, dv) = _grads(lambda a, b, c: attention(a, b, c, mask), q, k, v)
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    assert torch.equal(dq[0, :, 1], torch.zeros(2, 16)) and torch.equal(dq[1], torch.zeros(2, 3, 16))
    assert torch.equal(dk[1], torch.zeros(1, 4, 16)) and torch.equal(dv[1], torch.zeros(1, 4, 16))


def test_a_trainer_forward_under_the_mode_backpropagates():
    """The RL trainer's side: a transformers model with the "detsample" attention under
    the mode, autograd on, gives the no-grad logits bit for bit and finite gradients."""
    from detsample.models import build_tiny

    model = build_tiny("hf-tiny-llama")
    register_attention()
    model.set_attn_implementation(ATTENTION_NAME)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with batch_invariant():
        with torch.no_grad():
            ref = model(input_ids=ids).logits
        logits = model(input_ids=ids).logits
        torch.log_softmax(logits, dim=-1)[0, :-1].gather(1, ids[0, 1:, None]).sum().backward()
    assert torch.equal(logits.detach(), ref)
    grad = model.model.layers[0].self_attn.q_proj.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


# -- architectures' additions: soft-capping, sinks, unequal value dims, sliding windows ----


def _dense(q, k, v, allowed, softcap=None, sinks=None):
    """float64 reference of the attention with its extras."""
    G = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p[..., : k.shape[2]] @ v


def _window(T, L, w):
    """Causal with a sliding window of w keys: query t (the last T of L) sees (t-w, t]."""
    t = torch.arange(T)[:, None] + (L - T)
    j = torch.arange(L)[None, :]
    return (j <= t) & (j > t - w)


EXTRAS = [
    ("softcap", dict(softcap=5.0)),
    ("sinks", dict(sinks=torch.tensor([0.5, -1.0, 2.0, 0.0]))),
    ("both", dict(softcap=3.0, sinks=torch.tensor([1.0, 1.0, -2.0, 0.5]))),
]


@pytest.mark.parametrize("name,kw", EXTRAS, ids=[e[0] for e in EXTRAS])
def test_softcap_and_sinks_match_the_reference_and_stay_invariant(name, kw):
    from detsample.invariant.attention import Extras

    L = 2 * KEY_BLOCK + 7
    q, k, v = _qkv(1, 4, 2, L, L, seed=4)
    q = q * 3  # scores large enough for the cap to bite
    ex = Extras(**kw)
    full = attention(q, k, v, None, None, ex)
    ref = _dense(q, k, v, torch.ones(L, L, dtype=torch.bool).tril(), **kw)
    assert torch.allclose(full.double(), ref, atol=1e-5)
    plain = attention(q, k, v)
    assert not torch.allclose(full, plain, atol=1e-3)  # the extra changed something
    for n in (1, 2, KEY_BLOCK, KEY_BLOCK + 1, L):
        assert torch.equal(
            attention(q[:, :, n - 1 : n], k[:, :, :n], v[:, :, :n], None, None, ex), full[:, :, n - 1 : n]
        ), n


def test_value_head_dim_may_differ_from_the_query_one():
    """MLA (DeepSeek-V3): q/k of 24, v of 16."""
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 4, 30, 24, generator=g), torch.randn(1, 4, 30, 24, generator=g)
    v = torch.randn(1, 4, 30, 16, generator=g)
    full = attention(q, k, v)
    assert full.shape == (1, 4, 30, 16)
    assert torch.allclose(full.double(), _dense(q, k, v, torch.ones(30, 30, dtype=torch.bool).tril()), atol=1e-5)
    assert torch.equal(attention(q[:, :, 29:], k, v), full[:, :, 29:])


@pytest.mark.parametrize("w", [8, KEY_BLOCK + 5])
def test_a_sliding_window_past_a_key_block_is_exact_and_invariant(w):
    """Bug pinned: block skipping assumed each query attends a prefix of the keys, so with
    a window every block after the first was skipped (logits off by ~10 on Gemma 3 at 300
    tokens). And a decode step whose window leaves early keys out must still place keys
    where the prefill does: the padding mask (``Extras.keys``) says which slots hold keys."""
    from detsample.invariant.attention import Extras

    L = 3 * KEY_BLOCK + 11
    q, k, v = _qkv(1, 4, 2, L, L, seed=6)
    full = attention(q, k, v, _window(L, L, w))
    assert torch.allclose(full.double(), _dense(q, k, v, _window(L, L, w)), atol=1e-5)
    keys = torch.ones(1, L, dtype=torch.bool)
    for n in (w + 1, KEY_BLOCK + 3, 2 * KEY_BLOCK + 1, L):
        step = attention(q[:, :, n - 1 : n], k[:, :, :n], v[:, :, :n], _window(1, n, w), None, Extras(keys=keys[:, :n]))
        assert torch.equal(step, full[:, :, n - 1 : n]), n


def test_the_transformers_function_takes_softcap_sinks_and_the_padding_mask():
    from detsample.invariant.attention import KEYS_ATTR, hf_attention

    q, k, v = _qkv(1, 4, 2, 12, 12, seed=7)
    mask = torch.ones(1, 1, 12, 12, dtype=torch.bool).tril()
    setattr(mask, KEYS_ATTR, torch.ones(1, 12, dtype=torch.bool))
    mod = torch.nn.Module()
    sinks = torch.tensor([0.1, 0.2, 0.3, 0.4])
    out, _ = hf_attention(mod, q, k, v, mask, scaling=None, softcap=4.0, s_aux=sinks)
    ref = _dense(q, k, v, mask[0, 0], softcap=4.0, sinks=sinks).transpose(1, 2)
    assert torch.allclose(out.double(), ref, atol=1e-5)
    with pytest.raises(ValueError, match="position_bias"):
        hf_attention(mod, q, k, v, mask, position_bias=torch.zeros(1))


def test_gradients_through_softcap_and_sinks_are_exact_math():
    from detsample.invariant.attention import Extras

    q, k, v = (t.requires_grad_() for t in _qkv(1, 4, 2, 9, 9, seed=8))
    sinks = torch.tensor([0.5, -0.5, 1.0, 0.0], requires_grad=True)
    out = attention(q, k, v, None, None, Extras(softcap=4.0, sinks=sinks))
    out.square().sum().backward()
    got = [t.grad.clone() for t in (q, k, v, sinks)]
    for t in (q, k, v, sinks):
        t.grad = None
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    _dense(q, k, v, causal, softcap=4.0, sinks=sinks).float().square().sum().backward()
    for a, b in zip(got, (q.grad, k.grad, v.grad, sinks.grad)):
        assert torch.allclose(a, b, atol=1e-4)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    st.integers(1, 3),  # batch rows
    st.sampled_from(HEADS),
    st.integers(1, 4),  # queries
    st.integers(1, 2 * KEY_BLOCK + 9),  # keys of the longest row
    st.sampled_from(["causal", "padded", "additive", "softcap", "sinks"]),
    st.booleans(),  # portable
    st.integers(0, 2**16),
)
def test_every_block_at_once_gives_the_block_loops_bits(B, heads, T, L, kind, portable, seed):
    """The one-pass path (every key block of every query in one product each: a decode
    step) against the block-by-block loop it replaces, forced by a zero budget: equal
    bits for random shapes, padded rows, additive masks, soft-capping, sinks, both
    variants. Bug pinned: a rescale applied once for all blocks instead of per block
    (and a block's running maximum taken from the next block)."""
    from detsample.invariant.attention import Extras

    att = importlib.import_module("detsample.invariant.attention")  # the module (the package exports its function)
    h, hkv = heads
    T = min(T, L)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, n, m, 16, generator=g) * 2 for n, m in ((h, T), (hkv, L), (hkv, L)))
    mask = torch.ones(T, L, dtype=torch.bool).tril(L - T)[None, None].repeat(B, 1, 1, 1)
    if kind in ("padded", "additive") and B > 1:
        short = int(torch.randint(0, L, (1,), generator=g))
        mask[1, :, :, :short] = False  # row 1 left-padded
        mask[1, :, :, L - 1] = True
    ex = Extras()
    if kind == "additive":
        mask = torch.where(mask, torch.randn(mask.shape, generator=g) * 0.5, torch.finfo(torch.float32).min)
    if kind == "softcap":
        ex = Extras(softcap=4.0)
    if kind == "sinks":
        ex = Extras(sinks=torch.randn(h, generator=g))
    ran = []
    one_pass = att._every_block
    with batch_invariant(portable=portable), pytest.MonkeyPatch.context() as mp:
        mp.setattr(att, "_every_block", lambda *a: ran.append(1) or one_pass(*a))
        once, lse_once = att.attend(q, k, v, mask, None, ex)
        mp.setattr(att, "ONE_PASS_SCORES", 0)
        mp.setattr(att, "ONE_PASS_PORTABLE_VALUES", 0)
        loop, lse_loop = att.attend(q, k, v, mask, None, ex)
    assert ran == [1] or T > 1  # a single query always takes the one pass
    assert torch.equal(once, loop) and torch.equal(lse_once, lse_loop)


def _layout_calls(mp, att) -> list:
    made = []
    build = att._make_layout
    mp.setattr(att, "_make_layout", lambda *a: made.append(1) or build(*a))
    return made


@pytest.mark.parametrize("kind", ["causal", "padded", "additive"])
def test_a_mask_layout_is_served_to_every_layer_and_never_stale(kind):
    """The key layout a mask decides (compaction, masked keys, blocks' first rows) is
    computed at the first layer of a forward and served to the next ones (same mask
    object): the same bits as computed afresh. Changed in place (a key masked out), or
    passed with another padding mask or query count, it is computed again; so is one
    written through ``.numpy()`` (no version bump). Pins a cache keyed on the mask's
    identity alone (the in-place change is then served the old layout and a masked-out
    key still attended: fails), and one trusting the version counter alone (the numpy
    write: fails)."""
    from detsample.invariant.attention import Extras

    att = importlib.import_module("detsample.invariant.attention")
    B, L = 2, KEY_BLOCK + 9
    q, k, v = _qkv(B, 4, 2, 1, L, seed=3)
    mask = torch.ones(B, 1, 1, L, dtype=torch.bool)
    if kind != "causal":
        mask[1, :, :, :7] = False  # row 1 left-padded
    if kind == "additive":
        mask = torch.where(mask, torch.randn(mask.shape) * 0.5, torch.finfo(torch.float32).min)
    with batch_invariant(), pytest.MonkeyPatch.context() as mp:
        made = _layout_calls(mp, att)
        first = att.attend(q, k, v, mask, None)[0]
        again = [att.attend(q, k2, v2, mask, None)[0] for k2, v2 in ((k, v), (k * 2, v + 1))]
        assert made == [1]  # one layout for three "layers"
        assert torch.equal(again[0], first)
        fresh = att.attend(q, k * 2, v + 1, mask.clone(), None)[0]  # another mask object: computed
        assert torch.equal(again[1], fresh) and made == [1, 1]
        if kind == "additive":
            mask[0, :, :, 3] = torch.finfo(torch.float32).min  # in place: key 3 of row 0 masked out
        else:
            mask[0, :, :, 3] = False
        changed = att.attend(q, k, v, mask, None)[0]
        assert torch.equal(changed, att.attend(q, k, v, mask.clone(), None)[0])
        assert not torch.equal(changed[0], first[0]) and torch.equal(changed[1], first[1])
        n = len(made)
        before = att.attend(q, k, v, mask, None)[0]  # served
        mask.numpy()[1, 0, 0, 20] = False if kind != "additive" else torch.finfo(torch.float32).min  # no version bump
        assert torch.equal(before, changed) and len(made) == n
        bypassed = att.attend(q, k, v, mask, None)[0]
        assert len(made) == n + 1 and torch.equal(bypassed, att.attend(q, k, v, mask.clone(), None)[0])
        assert not torch.equal(bypassed[1], changed[1])
        keys = torch.ones(B, L, dtype=torch.bool)
        n = len(made)
        att.attend(q, k, v, mask, None, Extras(keys=keys))  # another padding mask: computed
        att.attend(q, k, v, mask, None, Extras(keys=keys))  # the same one: served
        assert len(made) == n + 1
        q3 = torch.cat([q, q, q], dim=2)
        att.attend(q3, k, v, mask, None)  # 3 queries: other dims, computed
        assert len(made) == n + 2


def test_a_layout_is_served_only_with_the_same_padding_mask_object():
    """A sliding window leaves a decode query's early keys unattended: the padding mask
    (``Extras.keys``) then decides the compaction (all the row's keys, or only the
    window's). Two padding masks at the same version counter get their own layouts.
    Pins a cache keyed on the padding mask's version alone (the second is then served
    the first's layout: fails)."""
    att = importlib.import_module("detsample.invariant.attention")
    B, L, W = 2, 40, 5
    mask = torch.zeros(B, 1, 1, L, dtype=torch.bool)
    mask[..., L - W :] = True  # a window of the last W keys
    every = torch.ones(B, L, dtype=torch.bool)
    window = (torch.arange(L) >= L - W).expand(B, L).clone()
    assert every._version == window._version
    dims, dev = (B, 2, 1, 2, L), torch.device("cpu")
    assert att.key_layout(mask, every, dims, dev).lc == L
    assert att.key_layout(mask, window, dims, dev).lc == W
    assert att.key_layout(mask, every, dims, dev).lc == L


def test_a_long_prefills_layout_is_not_kept_beside_its_mask(monkeypatch):
    """A layout over the cache's budget (a long prefill's (B * Hkv, T * G, lc) masks) is
    computed per call, not kept alive as long as the caller keeps the mask; an
    inference-mode mask (no version counter) is never cached."""
    att = importlib.import_module("detsample.invariant.attention")
    B, T, L = 1, 8, 8
    q, k, v = _qkv(B, 4, 2, T, L, seed=5)
    mask = torch.ones(T, L, dtype=torch.bool).tril()[None, None]
    made = _layout_calls(monkeypatch, att)
    monkeypatch.setattr(att, "LAYOUT_CACHE_BYTES", 0)
    want = att.attend(q, k, v, mask, None)[0]
    assert torch.equal(att.attend(q, k, v, mask, None)[0], want) and made == [1, 1]
    monkeypatch.setattr(att, "LAYOUT_CACHE_BYTES", 1 << 20)
    att.attend(q, k, v, mask, None)
    att.attend(q, k, v, mask, None)
    assert made == [1, 1, 1]
    with torch.inference_mode():
        frozen = torch.ones(T, L, dtype=torch.bool).tril()[None, None]
        outs = [att.attend(q, k, v, frozen, None)[0] for _ in range(2)]
    assert made == [1, 1, 1, 1, 1] and torch.equal(outs[0], want) and torch.equal(outs[1], want)
