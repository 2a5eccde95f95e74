"""The fused recurrent scans (detsample/invariant/scans.py): the numpy oracle's bits, one
function of a row's positions however they are called, and the modeling code's function.

* bit for bit the oracle (oracles/scans.py) on random shapes and values (hypothesis),
  large magnitudes and decays that underflow included;
* ``T`` positions in one call == any split into calls, a row alone == among others,
  1 thread == 2 threads, bitwise;
* no fused multiply-add in the compiled kernels (detsample's flags; fast-math emits them);
* the same function as transformers' own gated delta rule and Mamba 2 step (within a
  float32 rounding bound), and at least as close to a float64 recurrence as the
  position-by-position float32 ops.

Pins: a kernel whose bits followed the call's split, the batch or the thread count; an
FMA contracted by the compiler; a prelude (head grouping, l2 norm, scale) that drifted
from the modeling code's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.mamba2 import modeling_mamba2 as m2
from transformers.models.qwen3_5 import modeling_qwen3_5 as q35

from detsample.invariant import scans
from detsample.probe.threads import torch_threads
from oracles import scans as oracle
from tests.arith.fma import FMA, cpu_has_fma, fresh_asm


def _gdn(
    seed: int,
    b: int = 2,
    h: int = 3,
    t: int = 6,
    dk: int = 8,
    dv: int = 4,
    scale: float = 1.0,
    per_feature: bool = False,
) -> dict:
    """A gated delta-net's inputs (one decay per head), or Kimi delta attention's
    (``per_feature``: one per key feature)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(b, h, t, dk, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(b, h, t, dk, generator=g), dim=-1)
    decay = -torch.rand(b, h, t, *((dk,) if per_feature else ()), generator=g) * 3
    return dict(
        q=q,
        k=k,
        v=torch.randn(b, h, t, dv, generator=g) * scale,
        g=decay,
        beta=torch.rand(b, h, t, generator=g),
        state=torch.randn(b, h, dk, dv, generator=g) * scale,
    )


def _ssd(
    seed: int,
    b: int = 2,
    h: int = 4,
    groups: int = 2,
    t: int = 6,
    p: int = 4,
    n: int = 8,
    scale: float = 1.0,
    skip: bool = True,
) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(
        x=torch.randn(b, h, t, p, generator=g) * scale,
        dt=torch.rand(b, h, t, generator=g),
        a=-torch.rand(h, generator=g) - 0.1,
        bm=torch.randn(b, groups, t, n, generator=g),
        cm=torch.randn(b, groups, t, n, generator=g),
        d=torch.randn(h, generator=g) if skip else None,
        state=torch.randn(b, h, p, n, generator=g) * scale,
    )


def _mamba(
    seed: int, b: int = 2, inner: int = 5, t: int = 6, n: int = 8, scale: float = 1.0, skip: bool = True
) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(
        x=torch.randn(b, inner, t, generator=g) * scale,
        dt=torch.rand(b, inner, t, generator=g),
        a=-torch.rand(inner, n, generator=g) - 0.1,
        bm=torch.randn(b, t, n, generator=g),
        cm=torch.randn(b, t, n, generator=g),
        d=torch.randn(inner, generator=g) if skip else None,
        state=torch.randn(b, inner, n, generator=g) * scale,
    )


def _lightning(seed: int, b: int = 2, h: int = 3, t: int = 6, d: int = 8, dv: int = 8, scale: float = 1.0) -> dict:
    """MiniMax lightning attention's inputs: q, k, v after the projection's activation, a
    decay ``exp(-slope)`` per head."""
    g = torch.Generator().manual_seed(seed)
    return dict(
        q=torch.randn(b, h, t, d, generator=g),
        k=torch.randn(b, h, t, d, generator=g),
        v=torch.randn(b, h, t, dv, generator=g) * scale,
        ratio=torch.rand(h, generator=g) * 0.5 + 0.5,
        state=torch.randn(b, h, d, dv, generator=g) * scale,
    )


def _run(fn, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    state = inputs["state"].clone()
    args = {k: v for k, v in inputs.items() if k != "state"}
    return fn(**args, state=state), state


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().numpy().view(np.uint32)


def _same(a, b) -> bool:
    return np.array_equal(_bits(torch.as_tensor(a)), _bits(torch.as_tensor(b)))


def _gdn_oracle(inputs: dict) -> tuple[np.ndarray, np.ndarray]:
    q, k, v, g, beta, s = (inputs[n].numpy() for n in ("q", "k", "v", "g", "beta", "state"))
    g = np.repeat(g[..., None], k.shape[-1], -1) if g.ndim == 3 else g  # a decay per feature
    outs, states = np.empty(v.shape, np.float32), np.empty(s.shape, np.float32)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            outs[b, h], states[b, h] = oracle.gated_delta(q[b, h], k[b, h], v[b, h], g[b, h], beta[b, h], s[b, h])
    return outs, states


def _ssd_oracle(inputs: dict) -> tuple[np.ndarray, np.ndarray]:
    x, dt, a, bm, cm, s = (inputs[n].numpy() for n in ("x", "dt", "a", "bm", "cm", "state"))
    d = inputs["d"]
    per = x.shape[1] // bm.shape[1]
    outs, states = np.empty(x.shape, np.float32), np.empty(s.shape, np.float32)
    for b in range(x.shape[0]):
        for h in range(x.shape[1]):
            outs[b, h], states[b, h] = oracle.ssd(
                x[b, h], dt[b, h], a[h], bm[b, h // per], cm[b, h // per], None if d is None else d.numpy()[h], s[b, h]
            )
    return outs, states


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    b=st.integers(1, 3),
    h=st.integers(1, 3),
    t=st.integers(1, 9),
    dk=st.integers(1, 12),
    dv=st.integers(1, 12),
    scale=st.sampled_from([1.0, 1e-30, 3e4, 1e18]),
    per_feature=st.booleans(),
)
def test_gated_delta_is_the_oracle_bit_for_bit(seed, b, h, t, dk, dv, scale, per_feature):
    """Both decays: per head (gated delta-net) and per key feature (Kimi delta attention)."""
    inputs = _gdn(seed, b, h, t, dk, dv, scale, per_feature)
    out, state = _run(scans.gated_delta, inputs)
    want, want_state = _gdn_oracle(inputs)
    assert _same(out, want) and _same(state, want_state)


def _mamba_oracle(inputs: dict) -> tuple[np.ndarray, np.ndarray]:
    x, dt, a, bm, cm, s = (inputs[n].numpy() for n in ("x", "dt", "a", "bm", "cm", "state"))
    d = inputs["d"]
    outs, states = np.empty(x.shape, np.float32), np.empty(s.shape, np.float32)
    for b in range(x.shape[0]):
        for i in range(x.shape[1]):
            outs[b, i], states[b, i] = oracle.selective(
                x[b, i], dt[b, i], a[i], bm[b], cm[b], None if d is None else d.numpy()[i], s[b, i]
            )
    return outs, states


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    b=st.integers(1, 3),
    inner=st.integers(1, 6),
    t=st.integers(1, 9),
    n=st.integers(1, 12),
    scale=st.sampled_from([1.0, 1e-30, 3e4, 1e18]),
    skip=st.booleans(),
)
def test_selective_is_the_oracle_bit_for_bit(seed, b, inner, t, n, scale, skip):
    inputs = _mamba(seed, b, inner, t, n, scale, skip)
    out, state = _run(scans.selective, inputs)
    want, want_state = _mamba_oracle(inputs)
    assert _same(out, want) and _same(state, want_state)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    b=st.integers(1, 3),
    groups=st.integers(1, 2),
    per=st.integers(1, 3),
    t=st.integers(1, 9),
    p=st.integers(1, 10),
    n=st.integers(1, 12),
    scale=st.sampled_from([1.0, 1e-30, 3e4, 1e18]),
    skip=st.booleans(),
)
def test_ssd_is_the_oracle_bit_for_bit(seed, b, groups, per, t, p, n, scale, skip):
    inputs = _ssd(seed, b, groups * per, groups, t, p, n, scale, skip)
    out, state = _run(scans.ssd, inputs)
    want, want_state = _ssd_oracle(inputs)
    assert _same(out, want) and _same(state, want_state)


def test_a_decay_that_underflows_and_a_huge_step_match_the_oracle():
    """exp(g) of g = -200 is 0 (the state forgets), dt * a of -1e4 too; the oracle agrees."""
    gdn = _gdn(5)
    gdn["g"][0, 0, 2] = -200.0
    out, state = _run(scans.gated_delta, gdn)
    assert _same(out, _gdn_oracle(gdn)[0]) and _same(state, _gdn_oracle(gdn)[1])
    ssm = _ssd(5)
    ssm["dt"][1, 2, 3] = 1e4
    out, state = _run(scans.ssd, ssm)
    assert _same(out, _ssd_oracle(ssm)[0]) and _same(state, _ssd_oracle(ssm)[1])


def _slice(inputs: dict, sl: slice, state: torch.Tensor, time_dim: dict) -> dict:
    return {
        k: (
            state
            if k == "state"
            else v
            if v is None or k not in time_dim
            else v.narrow(time_dim[k], sl.start, sl.stop - sl.start)
        )
        for k, v in inputs.items()
    }


GDN_TIME = dict(q=2, k=2, v=2, g=2, beta=2)
LIGHTNING_TIME = dict(q=2, k=2, v=2)
SSD_TIME = dict(x=2, dt=2, bm=2, cm=2)
MAMBA_TIME = dict(x=2, dt=2, bm=1, cm=1)


@pytest.mark.parametrize(
    "name, make, fn, time_dim, out_dim",
    [
        ("gated delta", _gdn, scans.gated_delta, GDN_TIME, 2),
        ("mamba2", _ssd, scans.ssd, SSD_TIME, 2),
        ("mamba", _mamba, scans.selective, MAMBA_TIME, 2),
        ("lightning", _lightning, scans.lightning, LIGHTNING_TIME, 2),
    ],
    ids=["gated-delta", "mamba2", "mamba", "lightning"],
)
@pytest.mark.parametrize("cuts", [(1, 2, 3, 4, 5), (4,), (2, 5)], ids=["one-by-one", "4+2", "2+3+1"])
def test_a_call_of_T_positions_is_any_split_into_calls(name, make, fn, time_dim, out_dim, cuts):
    inputs = make(11, t=6)
    whole, final = _run(fn, inputs)
    state, parts = inputs["state"].clone(), []
    for a, b in zip((0, *cuts), (*cuts, 6)):
        parts.append(
            fn(**{k: v for k, v in _slice(inputs, slice(a, b), state, time_dim).items() if k != "state"}, state=state)
        )
    assert _same(torch.cat(parts, out_dim), whole) and _same(state, final)


@pytest.mark.parametrize(
    "make, fn",
    [(_gdn, scans.gated_delta), (_ssd, scans.ssd), (_mamba, scans.selective), (_lightning, scans.lightning)],
    ids=["gated-delta", "mamba2", "mamba", "lightning"],
)
def test_a_row_alone_equals_it_among_others_on_1_and_2_threads(make, fn):
    """Rows of batch x heads split over threads; enough work for the split to happen."""
    inputs = make(3, b=4, t=40)
    with torch_threads(1):
        one, one_state = _run(fn, inputs)
    with torch_threads(2):
        two, two_state = _run(fn, inputs)
    alone, alone_state = _run(
        fn, {k: (v[2:3] if v is not None and v.dim() > 1 and k != "a" else v) for k, v in inputs.items()}
    )
    assert _same(one, two) and _same(one_state, two_state)
    assert _same(alone, one[2:3]) and _same(alone_state, one_state[2:3])


def _args(kernel_name: str) -> tuple:
    f = np.zeros
    if kernel_name == "gated_delta_rows":
        return (
            f((1, 2, 4), np.float32),
            f((1, 2, 4), np.float32),
            f((1, 2, 4), np.float32),
            f((1, 2, 4), np.float32),
            f((1, 2), np.float32),
            f((1, 4, 4), np.float32),
            f((1, 2, 4), np.float32),
            0,
            1,
        )
    if kernel_name == "lightning_rows":
        z = f((1, 2, 4), np.float32)
        return (z, z.copy(), z.copy(), f(1, np.float32), f((1, 4, 4), np.float32), z.copy(), 0, 1)
    if kernel_name == "selective_rows":
        return (
            f((1, 1, 2), np.float32),
            f((1, 1, 2), np.float32),
            f((1, 4), np.float32),
            f((1, 2, 4), np.float32),
            f((1, 2, 4), np.float32),
            f(1, np.float32),
            f((1, 1, 4), np.float32),
            f((1, 1, 2), np.float32),
            0,
            1,
        )
    return (
        f((1, 1, 2, 4), np.float32),
        f((1, 1, 2), np.float32),
        f(1, np.float32),
        f((1, 1, 2, 4), np.float32),
        f((1, 1, 2, 4), np.float32),
        f(1, np.float32),
        f((1, 1, 4, 4), np.float32),
        f((1, 1, 2, 4), np.float32),
        0,
        1,
    )


@pytest.mark.parametrize("kernel_name", ["gated_delta_rows", "ssd_rows", "selective_rows", "lightning_rows"])
def test_the_kernels_compile_to_no_fused_multiply_add(kernel_name):
    kernel = getattr(scans.jit(), kernel_name)
    assert not FMA.search(fresh_asm(kernel, _args(kernel_name), fastmath=False))
    if cpu_has_fma():  # positive control: the check sees an FMA where one is emitted
        assert FMA.search(fresh_asm(kernel, _args(kernel_name), fastmath=True))


def _gdn_f64(q, k, v, g, beta, s):
    """The gated delta rule in float64 (the accuracy yardstick): (B, H, T, d) inputs."""
    q, k, v, g, beta, s = (x.double() for x in (q, k, v, g, beta, s))
    outs = []
    for t in range(q.shape[2]):
        s = s * g[:, :, t].exp()[..., None, None]
        delta = (v[:, :, t] - (s * k[:, :, t, :, None]).sum(-2)) * beta[:, :, t, None]
        s = s + k[:, :, t, :, None] * delta[:, :, None, :]
        outs.append((s * q[:, :, t, :, None]).sum(-2))
    return torch.stack(outs, 2), s


def test_the_gated_delta_rule_is_transformers_function_and_closer_to_float64():
    """transformers' tensors (B, T, heads, d), 2 value heads per key head, its l2 norm in
    the kernel: the fused rule's output and state within float32 rounding of transformers'
    recurrent rule, and no further from the float64 recurrence than it."""
    g = torch.Generator().manual_seed(7)
    b, t, hk, hv, d = 2, 48, 2, 4, 16
    q, k = torch.randn(b, t, hk, d, generator=g), torch.randn(b, t, hk, d, generator=g)
    v = torch.randn(b, t, hv, d, generator=g)
    gate, beta = -torch.rand(b, t, hv, generator=g), torch.rand(b, t, hv, generator=g)
    kw = dict(initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True)
    rule = scans.gated_delta_rule(q35.torch_recurrent_gated_delta_rule, q35.l2norm)
    out, state = rule(q, k, v, gate, beta, **kw)
    ref, ref_state = q35.torch_recurrent_gated_delta_rule(q, k, v, gate, beta, **kw)
    assert (out - ref).abs().max() < 1e-4 and (state - ref_state).abs().max() < 1e-4
    qn = q35.l2norm(q.repeat_interleave(2, 2), eps=1e-6) / d**0.5  # both rules' inputs
    kn = q35.l2norm(k.repeat_interleave(2, 2), eps=1e-6)
    exact, _ = _gdn_f64(*(x.transpose(1, 2) for x in (qn, kn, v, gate, beta)), torch.zeros(b, hv, d, d))
    exact = exact.transpose(1, 2)

    def rms(x: torch.Tensor) -> float:
        return float((x.double() - exact).pow(2).mean().sqrt())

    assert rms(out) <= rms(ref)


def test_the_kimi_delta_rule_is_transformers_function_within_float32_rounding():
    """transformers' tensors (B, T, heads, d), a decay per key feature, its l2 norm in the
    kernel: output and state within float32 rounding of transformers' recurrent rule."""
    from transformers.models.kimi_linear import modeling_kimi_linear as kimi

    g = torch.Generator().manual_seed(8)
    b, t, h, d = 2, 24, 3, 16
    q, k, v = (torch.randn(b, t, h, d, generator=g) for _ in range(3))
    gate, beta = -torch.rand(b, t, h, d, generator=g), torch.rand(b, t, h, generator=g)
    kw = dict(initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True)
    out, state = scans.kimi_delta_rule(kimi.recurrent_kimi_delta_attention, kimi.l2norm)(
        q, k, v, g=gate, beta=beta, **kw
    )
    ref, ref_state = kimi.recurrent_kimi_delta_attention(q, k, v, g=gate, beta=beta, **kw)
    assert (out - ref).abs().max() < 1e-4 and (state - ref_state).abs().max() < 1e-4


def test_the_mamba2_step_is_transformers_step_within_float32_rounding():
    """The decode branch's arguments (expanded per head): the fused step's output and
    state within float32 rounding of transformers' own step."""
    g = torch.Generator().manual_seed(9)
    b, h, p, n = 2, 4, 8, 16
    x, dt = torch.randn(b, h, p, generator=g), torch.randn(b, h, 1, generator=g).expand(-1, -1, p)
    a = (-torch.rand(h, generator=g) - 0.5)[:, None, None].expand(-1, p, n)
    bm, cm = torch.randn(b, 1, n, generator=g), torch.randn(b, 1, n, generator=g)
    d, bias = torch.randn(h, generator=g)[:, None].expand(-1, p), torch.randn(h, generator=g)[:, None].expand(-1, p)
    state = torch.randn(b, h, p, n, generator=g)
    ref_state = state.clone()
    out = scans.mamba2_step(state, x, dt, a, bm, cm, d, bias, True, (0.0, float("inf")))
    ref = m2.mamba2_selective_state_update(ref_state, x, dt, a, bm, cm, d, dt_bias=bias, dt_softplus=True)
    assert (out - ref).abs().max() < 1e-4 and (state - ref_state).abs().max() < 1e-5


def test_the_mamba_step_is_transformers_step_within_float32_rounding():
    """The decode branch's arguments (a gate z, D, a dt bias, softplus): output and state
    within float32 rounding of transformers' own step."""
    from transformers.models.mamba import modeling_mamba as m1

    g = torch.Generator().manual_seed(10)
    b, inner, n = 2, 6, 8
    x, dt, z = (torch.randn(b, inner, generator=g) for _ in range(3))
    a, bm, cm = -torch.rand(inner, n, generator=g) - 0.5, torch.randn(b, n, generator=g), torch.randn(b, n, generator=g)
    d, bias, state = (
        torch.randn(inner, generator=g),
        torch.randn(inner, generator=g),
        torch.randn(b, inner, n, generator=g),
    )
    ref_state = state.clone()
    out = scans.mamba_step(state, x, dt, a, bm, cm, d, z, bias, True)
    ref = m1.mamba_selective_state_update(ref_state, x, dt, a, bm, cm, d, dt_bias=bias, dt_softplus=True, z=z)
    assert (out - ref).abs().max() < 1e-5 and (state - ref_state).abs().max() < 1e-5


def test_a_decode_argument_that_is_not_one_value_per_head_is_refused_by_name():
    x = torch.randn(1, 2, 4)
    dt = torch.randn(1, 2, 4)  # differs along head_dim: not an expansion
    a = -torch.ones(2, 4, 8)
    with pytest.raises(ValueError, match="dt must repeat one value per head"):
        scans.mamba2_step(
            torch.zeros(1, 2, 4, 8),
            x,
            dt,
            a,
            torch.randn(1, 1, 8),
            torch.randn(1, 1, 8),
            None,
            None,
            False,
            (0.0, float("inf")),
        )


def _lightning_oracle(inputs: dict) -> tuple[np.ndarray, np.ndarray]:
    q, k, v, ratio, s = (inputs[n].numpy() for n in ("q", "k", "v", "ratio", "state"))
    outs, states = np.empty((*q.shape[:3], v.shape[3]), np.float32), np.empty_like(s)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            outs[b, h], states[b, h] = oracle.lightning(q[b, h], k[b, h], v[b, h], ratio[h], s[b, h])
    return outs, states


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    st.integers(0, 2**16),
    st.integers(1, 2),
    st.integers(1, 3),
    st.integers(1, 9),
    st.sampled_from([1, 4, 16]),
    st.sampled_from([1, 8]),
    st.sampled_from([1e-30, 1.0, 1e30]),
)
def test_lightning_is_the_oracle_bit_for_bit(seed, b, h, t, d, dv, scale):
    """MiniMax's lightning attention in one kernel against the numpy specification:
    ``S = ratio * S + k v^T`` (float32, the modeling code's order), ``o = q S`` (float64 of
    exact products, rounded once); tiny and huge magnitudes (overflow to inf included)."""
    inputs = _lightning(seed, b=b, h=h, t=t, d=d, dv=dv, scale=scale)
    out, state = _run(scans.lightning, inputs)
    want, want_state = _lightning_oracle(inputs)
    assert _same(out, want) and _same(state, want_state)


def test_lightning_attention_under_the_mode_is_one_kernel_near_transformers_recurrence():
    """MiniMax under the mode runs its recurrent update by the fused kernel (a prefill of
    many positions in one call, the same as its decode steps), within float32 rounding of
    transformers' own position-by-position recurrence (the ops, no mode); the class's
    forward is transformers' again after the mode. Negative control: the replaced forward
    is what ran (its plan is recorded)."""
    from transformers.models.minimax import modeling_minimax as home

    from detsample.invariant import batch_invariant, state
    from tests.invariant.architectures import BY_NAME, build

    model = build(BY_NAME["minimax"])
    original = vars(home.MiniMaxLightningAttention)["forward"]
    ids = torch.randint(0, 512, (1, 21), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        cache = home.MiniMaxCache()
        seed = [m for m in model.modules() if type(m).__name__ == "MiniMaxLightningAttention"]
        for m in seed:  # transformers' recurrent branch, from a zero state (no mode)
            cache.set_linear_cache(m.layer_idx, torch.zeros(1, m.num_attention_heads, m.head_dim, m.head_dim))
        ref = model(ids, past_key_values=cache).logits
        with state.plans().recording() as used, batch_invariant():
            got = model(ids).logits
            assert vars(home.MiniMaxLightningAttention)["forward"] is not original  # (at the first forward)
    assert ("scan", "lightning attention") in used
    assert vars(home.MiniMaxLightningAttention)["forward"] is original
    assert (got - ref).abs().max() < 1e-4


def test_half_precision_lightning_attention_runs_transformers_forward_under_the_mode():
    """A bfloat16 MiniMax (whose state the modeling code rounds to bfloat16 at every
    position, which the float32 kernel would not) takes transformers' forward, the
    update as ops: no fused scan recorded, the same bits as the forward with the fused
    cover switched off."""
    import importlib

    from detsample.invariant import batch_invariant, state
    from tests.invariant.architectures import BY_NAME, build

    mixers = importlib.import_module("detsample.invariant.mixers")
    model = build(BY_NAME["minimax"]).to(torch.bfloat16)
    ids = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        with state.plans().recording() as used, batch_invariant():
            got = model(ids).logits
        with pytest.MonkeyPatch.context() as mp, batch_invariant():
            mp.setattr(mixers.FusedSeededCover, "matches", lambda self, m: False)
            ops = model(ids).logits
    assert ("scan", "lightning attention") not in used
    assert torch.equal(got.view(torch.int16), ops.view(torch.int16))
