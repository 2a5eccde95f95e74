"""Recurrent mixers' scans in one fused kernel: a prefill and a decode step by one arithmetic.

Under the mode a covered mixer's prefill and decode step are both computed by its
recurrent update, position by position (:mod:`detsample.invariant.mixers`), so the state
after position ``t`` is one function of positions ``0..t`` however the sequence was split
into calls. Run as the modeling code writes it, that update is a dozen small torch ops per
position, each through the mode's kernels: a prefill of 512 positions cost 5-10x the
default kernels' chunked scan. The functions here compute the same recurrence in one
numba kernel per call (:mod:`detsample.invariant.scan_jit`), rows of ``batch x heads``
split over threads, for the gated delta-net (Qwen3.5, Qwen3.5-MoE, Qwen3-Next), Kimi
delta attention (Kimi-Linear), Mamba 2 (Mamba2, Nemotron-H, Granite-4 hybrid, Bamba,
Falcon-H1, Zamba2), Mamba (Mamba, FalconMamba, Jamba) and MiniMax's lightning attention
(whose whole forward is replaced: :func:`lightning_forward`).

What the bits rest on: detsample's arithmetic alone, in both variants (verified and
portable) and on every CPU -- float32 elementwise updates in the modeling code's order,
contractions over the state as float64 sums of exact products in a fixed order rounded
once to float32, detsample's ``exp`` (the definition: scan_jit's docstring and
``oracles/scans.py``, which reproduces the bits in numpy). One row's bits depend on that
row alone (batch, padding and thread count change none), and a call of ``T`` positions
is ``T`` single-position calls (prefill == decode == any chunking). Against the
position-by-position ops the contractions differ in rounding only: each is within half a
float32 ulp of its float64 sum, which is within ``n 2**-53 sum |terms|`` of the exact sum
(n terms), where a float32 sum of the ops errs by up to ``n 2**-24 sum |terms|``
(tests/invariant/test_scans.py measures both against a float64 recurrence).

The prelude of each function (head grouping, the l2 norms and scale, the Mamba steps'
bias, softplus and limit, Mamba's output gate) stays torch ops under the mode, as the
modeling code writes them. CUDA tensors take the position-by-position path (the kernel
is CPU code); a process without numba does too, for every call alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from detsample.arith.cpu import available, split_rows
from detsample.invariant.state import ARITHMETIC, STATE, Plan


@functools.cache
def jit() -> Any:
    """The numba kernels module; ImportError when numba is not installed."""
    from detsample.invariant import scan_jit

    return scan_jit


def fused(*tensors: torch.Tensor) -> bool:
    """Whether a call on ``tensors`` runs the fused kernel: CPU tensors, numba here."""
    return available() and all(t.device.type == "cpu" for t in tensors)


def _note(name: str) -> None:
    STATE.plans.get(
        ("scan", name), lambda: Plan(f"fused {name} scan", ARITHMETIC, "one kernel for a prefill and a decode step")
    )


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32, memory_format=torch.contiguous_format).contiguous()


def gated_delta(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> torch.Tensor:
    """The gated delta rule over ``T`` positions, bitwise as ``T`` calls of one.

    q, k (B, H, T, dk), v (B, H, T, dv), beta (B, H, T), g (B, H, T) (a gated delta-net's
    decay per head) or (B, H, T, dk) (Kimi delta attention's per key feature): float32 (q
    normalised and scaled); state (B, H, dk, dv) float32 contiguous, updated in place.
    Returns (B, H, T, dv) float32."""
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    out = torch.empty((b, h, t, dv), dtype=torch.float32)
    rows = b * h
    g = g[..., None].expand(b, h, t, dk) if g.dim() == 3 else g
    arrays = [_f32(x).numpy().reshape(rows, t, -1) for x in (q, k, v, g)]
    bs = _f32(beta).numpy().reshape(rows, t)
    s, o = state.numpy().reshape(rows, dk, dv), out.numpy().reshape(rows, t, dv)
    kernel = jit().gated_delta_rows
    _note("gated delta")
    split_rows(lambda lo, hi: kernel(*arrays, bs, s, o, lo, hi), rows, rows * t * dk * dv)
    return out


def ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    bm: torch.Tensor,
    cm: torch.Tensor,
    d: torch.Tensor | None,
    state: torch.Tensor,
) -> torch.Tensor:
    """The Mamba 2 update over ``T`` positions, bitwise as ``T`` calls of one.

    x (B, H, T, P), dt (B, H, T) (after bias, softplus and limit), a (H,), bm, cm
    (B, G, T, N), d (H,) or None; state (B, H, P, N) float32 contiguous, updated in place.
    Returns (B, H, T, P) float32."""
    b, h, t, p = x.shape
    out = torch.empty((b, h, t, p), dtype=torch.float32)
    skip = _f32(d) if d is not None else torch.empty(0)
    args = [_f32(y).numpy() for y in (x, dt, a, bm, cm, skip)]
    kernel, s, o = jit().ssd_rows, state.numpy(), out.numpy()
    _note("mamba2")
    split_rows(lambda lo, hi: kernel(*args, s, o, lo, hi), b * h, b * h * t * p * bm.shape[-1])
    return out


def selective(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    bm: torch.Tensor,
    cm: torch.Tensor,
    d: torch.Tensor | None,
    state: torch.Tensor,
) -> torch.Tensor:
    """The Mamba (1) update over ``T`` positions, bitwise as ``T`` calls of one.

    x, dt (B, I, T) (dt after bias and softplus), a (I, N), bm, cm (B, T, N), d (I,) or
    None; state (B, I, N) float32 contiguous, updated in place. Returns (B, I, T) float32."""
    b, inner, t = x.shape
    out = torch.empty((b, inner, t), dtype=torch.float32)
    skip = _f32(d) if d is not None else torch.empty(0)
    args = [_f32(y).numpy() for y in (x, dt, a, bm, cm, skip)]
    kernel, s, o = jit().selective_rows, state.numpy(), out.numpy()
    _note("mamba")
    split_rows(lambda lo, hi: kernel(*args, s, o, lo, hi), b * inner, b * inner * t * a.shape[-1])
    return out


def _selective_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, softplus: bool) -> torch.Tensor:
    """A Mamba step's ``dt`` as its decode step makes it: ``dt + dt_bias``, softplus."""
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    return F.softplus(dt) if softplus else dt


def _gated(out: torch.Tensor, z: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    return (out if z is None else out * F.silu(z.to(torch.float32))).to(dtype)


def mamba_scan(x, dt, A, B, C, D, z, dt_bias, dt_softplus, state):
    """``mamba_selective_scan``'s result by :func:`selective`: x, dt, z (B, I, T); A (I, N);
    B, C (B, N, T); D, dt_bias (I,); state (B, I, N) float32 contiguous, updated in place.
    Returns (B, I, T) in x's dtype."""
    bias = None if dt_bias is None else dt_bias[:, None]
    out = selective(x, _selective_dt(dt, bias, dt_softplus), A, B.transpose(1, 2), C.transpose(1, 2), D, state)
    return _gated(out, z, x.dtype)


def mamba_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus):
    """``mamba_selective_state_update``'s result by :func:`selective` (one position): state
    (B, I, N) updated in place; x, dt, z (B, I); A (I, N); B, C (B, N); D, dt_bias (I,).
    Returns (B, I) in x's dtype."""
    with _updated(state) as s:
        out = selective(
            x[..., None], _selective_dt(dt, dt_bias, dt_softplus)[..., None], A, B[:, None], C[:, None], D, s
        )
    return _gated(out[..., 0], z, x.dtype)


@contextmanager
def _updated(state: torch.Tensor) -> Iterator[torch.Tensor]:
    """A float32 contiguous state a kernel may update in place: ``state`` itself when it is
    one, else a copy written back into ``state`` afterwards (a decode step's contract)."""
    if state.dtype == torch.float32 and state.is_contiguous():
        yield state
        return
    s = _start(state, tuple(state.shape))
    yield s
    state.copy_(s)


def _start(initial: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
    """A float32 contiguous state of ``shape`` the kernel may write: zeros, or a copy."""
    if initial is None:
        return torch.zeros(shape, dtype=torch.float32)
    return initial.to(torch.float32).clone(memory_format=torch.contiguous_format)


def _delta_rule(step: Callable, prepare: Callable, name: str) -> Callable:
    """A replacement of a delta rule's two functions (transformers 5.x's keyword arguments,
    ``chunk_size`` ignored): ``prepare(query, key, value, g, beta, l2)`` is the modeling
    code's prelude, giving float32 (B, H, T, .) tensors for :func:`gated_delta`; ``step``
    (the recurrent original) runs calls on other devices."""

    def rule(
        query,
        key,
        value,
        g,
        beta,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        chunk_size=None,
        **kwargs,
    ):
        if not fused(query, key, value, g, beta):
            return step(
                query,
                key,
                value,
                g=g,
                beta=beta,
                initial_state=initial_state,
                output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                **kwargs,
            )
        dtype = query.dtype
        q, k, v, g, beta = prepare(query, key, value, g, beta, use_qk_l2norm_in_kernel)
        state = _start(initial_state, (*k.shape[:2], k.shape[-1], v.shape[-1]))
        out = gated_delta(q, k, v, g, beta, state)
        return out.transpose(1, 2).contiguous().to(dtype), (state if output_final_state else None)

    rule.__name__ = name
    return rule


def gated_delta_rule(step: Callable, l2norm: Callable) -> Callable:
    """Both of a gated delta-net's functions (``torch_chunk_gated_delta_rule`` and
    ``torch_recurrent_gated_delta_rule``) by :func:`gated_delta`, with the recurrent
    function's prelude (value heads grouped over key heads, float32, the module's
    ``l2norm``, ``query / sqrt(dk)``)."""

    def prepare(query, key, value, g, beta, l2):
        k_heads, v_heads = key.shape[2], value.shape[2]
        if k_heads != v_heads:
            query = query.repeat_interleave(v_heads // k_heads, dim=2)
            key = key.repeat_interleave(v_heads // k_heads, dim=2)
        query, key, value, beta, g = (_f32(x.transpose(1, 2)) for x in (query, key, value, beta, g))
        if l2:
            query, key = l2norm(query, dim=-1, eps=1e-6), l2norm(key, dim=-1, eps=1e-6)
        return query / (query.shape[-1] ** 0.5), key, value, g, beta

    return _delta_rule(step, prepare, "detsample_fused_gated_delta_rule")


def kimi_delta_rule(step: Callable, l2norm: Callable) -> Callable:
    """Both of Kimi delta attention's functions (``chunk_kimi_delta_attention`` and
    ``recurrent_kimi_delta_attention``) by :func:`gated_delta` with a decay per key
    feature, with the recurrent function's prelude (float32, the module's ``l2norm``,
    ``query * (1 / sqrt(dk))``)."""

    def prepare(query, key, value, g, beta, l2):
        query, key, value, g, beta = (x.to(torch.float32) for x in (query, key, value, g, beta))
        if l2:
            query, key = l2norm(query, dim=-1, eps=1e-6), l2norm(key, dim=-1, eps=1e-6)
        query = query * (1 / (query.shape[-1] ** 0.5))
        return tuple(x.transpose(1, 2) for x in (query, key, value, g, beta))

    return _delta_rule(step, prepare, "detsample_fused_kimi_delta_rule")


def mamba2_dt(
    dt: torch.Tensor, dt_bias: torch.Tensor | None, softplus: bool, limit: tuple[float, float]
) -> torch.Tensor:
    """A Mamba 2 step's ``dt`` as its chunked scan makes it: a Mamba step's
    (:func:`_selective_dt`: ``dt + dt_bias`` in ``dt``'s dtype, softplus), clamped to
    ``limit``. Elementwise: a position's bits do not depend on the layout or the call."""
    return torch.clamp(_selective_dt(dt, dt_bias, softplus), min=limit[0], max=limit[1])


def mamba2_scan(hidden_states, dt, A, B, C, D, dt_bias, initial_states, dt_softplus, dt_limit):
    """``mamba2_chunk_scan``'s result by :func:`ssd`: hidden_states (B, T, H, P); dt
    (B, T, H); A, D, dt_bias (H,); B, C (B, T, G, N); initial_states (B, H, P, N) or None.
    Returns (out (B, T, H, P) in hidden_states' dtype, final state float32)."""
    batch, _, heads, head_dim = hidden_states.shape
    step = mamba2_dt(dt, dt_bias, dt_softplus, dt_limit)
    state = _start(initial_states, (batch, heads, head_dim, B.shape[-1]))
    out = ssd(hidden_states.transpose(1, 2), step.transpose(1, 2), A, B.transpose(1, 2), C.transpose(1, 2), D, state)
    return out.transpose(1, 2).contiguous().to(hidden_states.dtype), state


def per_head(t: torch.Tensor | None, name: str, dims: int) -> torch.Tensor | None:
    """``t`` with its last ``dims`` dimensions dropped, where they only repeat each
    value (the decode branch's ``expand``); ValueError naming ``name`` where they do not."""
    if t is None:
        return None
    first = t[(..., *([0] * dims))]
    repeated = all(t.stride(-1 - i) == 0 for i in range(dims))
    if not repeated and not torch.equal(t, first[(..., *([None] * dims))].expand_as(t)):
        raise ValueError(
            f"mamba2_selective_state_update under the batch-invariant mode: {name} must "
            f"repeat one value per head over its last {dims} dimension(s), got shape "
            f"{tuple(t.shape)} with differing values"
        )
    return first


def mamba2_step(state, hidden_states, dt, A, B, C, D, dt_bias, dt_softplus, limit):
    """``mamba2_selective_state_update``'s result by :func:`ssd` (one position): state
    (B, H, P, N) updated in place; hidden_states (B, H, P); dt (B, H, P), A (H, P, N),
    D, dt_bias (H, P) as the decode branch expands them; B, C (B, G, N). Returns (B, H, P)
    in hidden_states' dtype."""
    step = mamba2_dt(per_head(dt, "dt", 1), per_head(dt_bias, "dt_bias", 1), dt_softplus, limit)
    with _updated(state) as s:
        out = ssd(
            hidden_states[:, :, None],
            step[:, :, None],
            per_head(A, "A", 2),
            B[:, :, None],
            C[:, :, None],
            per_head(D, "D", 1),
            s,
        )
    return out[:, :, 0].to(hidden_states.dtype)


def lightning(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ratio: torch.Tensor, state: torch.Tensor
) -> torch.Tensor:
    """MiniMax's lightning attention over ``T`` positions, bitwise as ``T`` calls of one.

    q, k (B, H, T, d), v (B, H, T, dv): float32; ratio (H,) float32 (``exp(-slope)`` per
    head); state (B, H, d, dv) float32 contiguous, updated in place. Returns (B, H, T, dv)
    float32."""
    b, h, t, d = k.shape
    dv = v.shape[-1]
    out = torch.empty((b, h, t, dv), dtype=torch.float32)
    rows = b * h
    arrays = [_f32(x).numpy().reshape(rows, t, -1) for x in (q, k, v)]
    rr = _f32(ratio.reshape(1, h).expand(b, h)).numpy().reshape(rows)
    s, o = state.numpy().reshape(rows, d, dv), out.numpy().reshape(rows, t, dv)
    kernel = jit().lightning_rows
    _note("lightning attention")
    split_rows(lambda lo, hi: kernel(*arrays, rr, s, o, lo, hi), rows, rows * t * d * dv)
    return out


def _call_arguments(args: tuple, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
    """``(hidden_states, attention_mask, cache)`` of a lightning attention call, passed by
    position or keyword (``past_key_values``: the deprecated name of ``cache``)."""
    names = ("hidden_states", "position_embeddings", "attention_mask", "cache")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    cache = bound.get("cache", bound.get("past_key_values"))
    return bound.get("hidden_states"), bound.get("attention_mask"), cache


def lightning_forward(original: Callable, home: Any) -> Callable:
    """``MiniMaxLightningAttention.forward`` (transformers 5.24) with its recurrent update by
    :func:`lightning`: the projections, the padding mask, the norm, the output gate and
    the out-projection as the modeling code runs them (through the mode's kernels), the
    state read from the cache (a zero one without: the mode's pre-hook seeds it) and a
    new state written back (the cache's tensor is never written). Float32 CPU calls only;
    the others (half precision, whose state the modeling code rounds at every position;
    CUDA; no numba) run ``original``: the position-by-position update as ops."""

    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        hidden, mask, cache = _call_arguments(args, kwargs)
        if not (isinstance(hidden, torch.Tensor) and hidden.dtype == torch.float32 and fused(hidden)):
            return original(self, *args, **kwargs)
        batch, length, _ = hidden.shape
        heads, d = self.num_attention_heads, self.head_dim
        qkv = home.apply_mask_to_padding_states(self.act_fn(self.qkv_proj(hidden)), mask)
        q, k, v = torch.split(qkv.reshape(batch, length, heads, 3 * d), d, dim=3)
        initial = cache.get_linear_cache(self.layer_idx) if cache is not None else None
        state = _start(initial, (batch, heads, d, d))
        ratio = torch.exp(-self.slope_rate)  # (H, 1, 1), as the modeling code computes it
        out = lightning(*(x.transpose(1, 2) for x in (q, k, v)), ratio.reshape(heads), state)
        out = self.norm(out.transpose(1, 2).reshape(batch, length, heads * d))
        out = self.out_proj(F.sigmoid(self.output_gate(hidden)) * out)
        if cache is not None:
            cache.set_linear_cache(self.layer_idx, state)
        return out, state

    return forward
