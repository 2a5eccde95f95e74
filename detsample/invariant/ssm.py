"""State-space prefills run as their decode step, position by position (Mamba and Mamba 2).

Mamba 2's and Mamba's prefill and decode step both run the fused kernel
(:mod:`detsample.invariant.scans`: one arithmetic, the recurrence of the decode step) where
it can run; the loop over the decode step described below is the reference form
(``fused=False``), run on other devices.

transformers computes a Mamba 2 prefill by ``mamba2_chunk_scan`` (blocks of ``chunk_size``
counted from the call's first token) and a decode step by ``mamba2_selective_state_update``
(the state updated in place, one token); a Mamba (1) prefill by ``mamba_selective_scan``
(which, on the torch path, starts from a zero state: a chunked prefill loses the state of
the chunks before it) and a decode step by ``mamba_selective_state_update``. The
functions here have the prefill function's signature and return value and compute it by
calling the decode step once per position, with exactly the arguments the mixer's own
decode branch passes it (the same shapes, views of the same tensors, the same dtypes), so a
prefill of ``T`` positions is ``T`` decode steps and a position's bits are those a decode
step gives it. The state carried between positions is float32, as the decode step keeps it
in the cache after a prefill. :mod:`detsample.invariant.mixers` puts them in place while
the mode is installed.

What they rest on (read in transformers 5.24's modeling files, and checked bitwise by the
architecture panel, tests/invariant/test_architectures.py):

* Mamba 2 (Mamba2, Nemotron-H, Granite-4 hybrid, Bamba, Falcon-H1): the decode branch
  passes ``dt`` as ``(B, H, P)``, ``A`` as ``(H, P, N)``, ``D`` and ``dt_bias`` as
  ``(H, P)`` expansions of what the prefill passes, ``z=None``, ``dt_softplus=True``. The
  prefill clamps the softplus'd ``dt`` to the mixer's ``time_step_limit``; the decode step
  does not. Under the mode both do (:func:`mamba2_decode`, with the limit of the mixer
  running), so decode == prefill also where the limit bites (Nemotron-H's lower limit is
  ``time_step_min``).
* Mamba (Mamba, FalconMamba, Jamba): the decode branch passes the mixer's ``D`` (the
  prefill gets ``D.float()``) and its cache's state; the prefill is given neither, so they
  are read from the mixer running (:class:`~detsample.invariant.mixers.Running`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from detsample.invariant import scans

#: the running covered mixer's forward: ``() -> Call`` (module, cache)
Current = Callable[[], Any]


def _limited(step: Callable, limit: tuple[float, float]) -> Callable:
    """``step`` with its ``dt`` made as the chunked scan makes it: ``dt + dt_bias``,
    softplus, then clamped to ``limit`` -- the same ops in the same order on the same values
    as inside ``step`` (elementwise, so the bits do not depend on the layout), then the clamp."""

    def run(state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None, **kwargs):
        dt = scans.mamba2_dt(dt, dt_bias, dt_softplus, limit)
        return step(state, hidden_states, dt, A, B, C, D, dt_bias=None, dt_softplus=False, z=z, **kwargs)

    return run


def mamba2_decode(step: Callable, current: Current, fused: bool = True) -> Callable:
    """``mamba2_selective_state_update`` that clamps ``dt`` to the running mixer's
    ``time_step_limit``, as its prefill does; by the fused kernel
    (:func:`detsample.invariant.scans.mamba2_step`) where ``fused`` and it can run, else
    by ``step``."""

    def update(state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None, **kwargs):
        limit = current().module.time_step_limit
        if fused and z is None and scans.fused(state, hidden_states, dt, B, C):
            return scans.mamba2_step(state, hidden_states, dt, A, B, C, D, dt_bias, dt_softplus, limit)
        return _limited(step, limit)(
            state, hidden_states, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=dt_softplus, z=z, **kwargs
        )

    update.__name__ = "detsample_limited_mamba2_selective_state_update"
    return update


def mamba2_prefill(step: Callable, current: Current, fused: bool = True) -> Callable:
    """``mamba2_chunk_scan`` computed by the decode step's arithmetic: by the fused kernel
    (:func:`detsample.invariant.scans.mamba2_scan`) where ``fused`` and it can run, else by
    ``step``, position by position (the reference).

    hidden_states (B, T, H, P); dt (B, T, H); A, D, dt_bias (H,); B, C (B, T, G, N);
    initial_states (B, H, P, N) or None. Returns (B, T, H, P) in ``hidden_states``' dtype,
    and the float32 final state (B, H, P, N) with ``return_final_states``."""

    def chunk_scan(
        hidden_states,
        dt,
        A,
        B,
        C,
        chunk_size=None,
        D=None,
        dt_bias=None,
        initial_states=None,
        dt_softplus=False,
        dt_limit=(0.0, float("inf")),
        return_final_states=False,
        **kwargs,
    ):
        if kwargs.pop("z", None) is not None:
            raise ValueError(
                "mamba2_chunk_scan under the batch-invariant mode: a gate z is not passed to the decode step; got one"
            )
        if fused and scans.fused(hidden_states, dt, B, C):
            out, state = scans.mamba2_scan(
                hidden_states, dt, A, B, C, D, dt_bias, initial_states, dt_softplus, dt_limit
            )
            return (out, state) if return_final_states else out
        batch, length, heads, head_dim = hidden_states.shape
        state = (
            torch.zeros(batch, heads, head_dim, B.shape[-1], dtype=torch.float32, device=hidden_states.device)
            if initial_states is None
            else initial_states.to(torch.float32).clone()
        )
        A = A[:, None, None].expand(-1, head_dim, B.shape[-1])
        D = None if D is None else D[:, None].expand(-1, head_dim)
        dt_bias = None if dt_bias is None else dt_bias[:, None].expand(-1, head_dim)
        update = _limited(step, dt_limit)
        outs = [
            update(
                state,
                hidden_states[:, t],
                dt[:, t, :, None].expand(-1, -1, head_dim),
                A,
                B[:, t],
                C[:, t],
                D,
                dt_bias=dt_bias,
                dt_softplus=dt_softplus,
                z=None,
                **kwargs,
            )
            for t in range(length)
        ]
        out = torch.stack(outs, dim=1) if outs else hidden_states.new_empty(hidden_states.shape)
        return (out, state) if return_final_states else out

    chunk_scan.__name__ = "detsample_sequential_mamba2_chunk_scan"
    return chunk_scan


def mamba_decode(step: Callable, current: Current, fused: bool = True) -> Callable:
    """``mamba_selective_state_update`` by the fused kernel
    (:func:`detsample.invariant.scans.mamba_step`) where ``fused`` and it can run, else
    ``step`` itself."""

    def update(state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None, **kwargs):
        if fused and scans.fused(state, hidden_states, dt, B, C):
            return scans.mamba_step(state, hidden_states, dt, A, B, C, D, z, dt_bias, dt_softplus)
        return step(state, hidden_states, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=dt_softplus, z=z, **kwargs)

    update.__name__ = "detsample_fused_mamba_selective_state_update"
    return update


def mamba_prefill(step: Callable, current: Current, fused: bool = True) -> Callable:
    """``mamba_selective_scan`` computed by the decode step's arithmetic, from the state the
    running mixer's cache holds (zeros without one): by the fused kernel
    (:func:`detsample.invariant.scans.mamba_scan`) where ``fused`` and it can run, else by
    ``step``, position by position (the reference).

    hidden_states, dt, z (B, I, T); A (I, N); B, C (B, N, T); D, delta_bias (I,). Returns
    (B, I, T) in ``hidden_states``' dtype, and the float32 last state (B, I, N) with
    ``return_last_state``."""

    def selective_scan(
        hidden_states,
        dt,
        A,
        B,
        C,
        D=None,
        z=None,
        delta_bias=None,
        delta_softplus=False,
        return_last_state=False,
        **kwargs,
    ):
        call = current()
        batch, inner, length = hidden_states.shape
        held = None if call.cache is None else call.cache.get_recurrent_state(call.module.layer_idx)
        state = (
            torch.zeros(batch, inner, A.shape[-1], dtype=torch.float32, device=hidden_states.device)
            if held is None
            else held.to(torch.float32).clone()
        )
        D = None if D is None else call.module.D  # what the decode branch passes
        if fused and scans.fused(hidden_states, dt, B, C):
            state = state.contiguous()
            out = scans.mamba_scan(hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus, state)
            return (out, state) if return_last_state else out
        outs = [
            step(
                state,
                hidden_states[..., t],
                dt[..., t],
                A,
                B[..., t],
                C[..., t],
                D,
                z=None if z is None else z[..., t],
                dt_bias=delta_bias,
                dt_softplus=delta_softplus,
            )
            for t in range(length)
        ]
        out = torch.stack(outs, dim=-1) if outs else hidden_states.new_empty(hidden_states.shape)
        return (out, state) if return_last_state else out

    selective_scan.__name__ = "detsample_sequential_mamba_selective_scan"
    return selective_scan
