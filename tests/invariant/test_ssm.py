"""State-space prefills run as their decode step (detsample/invariant/ssm.py), on
transformers' own torch functions (Mamba 2 and Mamba).

A prefill by the replacement equals the decode steps bitwise (outputs and final state),
also split in two calls, and stays the chunked scan's function (within 1e-4 of it); with a
dt limit that bites, the decode step is clamped as the prefill is -- transformers' bare
decode step is not, and differs (negative control).

Pins: a Mamba 2 decode step that skipped the dt limit its prefill applies (Nemotron-H's
lower limit), a Mamba prefill that restarted from a zero state after a chunk, a gate the
replacement would have dropped.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.models.mamba import modeling_mamba as m1
from transformers.models.mamba2 import modeling_mamba2 as m2

from detsample.invariant import batch_invariant
from detsample.invariant.mixers import Call, Running
from detsample.invariant.ssm import mamba2_decode, mamba2_prefill, mamba_prefill

BATCH, T, H, P, N, INNER = 2, 7, 4, 8, 16, 12
NO_LIMIT, BITES = (0.0, float("inf")), (0.05, float("inf"))


def _rand(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def _mamba2_inputs(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(
        hidden_states=_rand(g, BATCH, T, H, P),
        dt=_rand(g, BATCH, T, H),
        A=-torch.rand(H, generator=g) - 0.5,
        B=_rand(g, BATCH, T, 1, N),
        C=_rand(g, BATCH, T, 1, N),
        D=_rand(g, H),
        dt_bias=_rand(g, H) - 3.0,
    )


def _decode(inputs: dict, limit: tuple, step=None, fused: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """What the mixer's decode branch computes, one position at a time."""
    mixer = SimpleNamespace(time_step_limit=limit)
    step = step or mamba2_decode(m2.mamba2_selective_state_update, lambda: Call(mixer, None), fused)
    x, dt, A, B, C, D, bias = inputs.values()
    state, outs = torch.zeros(BATCH, H, P, N), []
    for t in range(T):
        outs.append(
            step(
                state,
                x[:, t],
                dt[:, t, :, None].expand(-1, -1, P),
                A[:, None, None].expand(-1, P, N),
                B[:, t],
                C[:, t],
                D[:, None].expand(-1, P),
                z=None,
                dt_bias=bias[:, None].expand(-1, P),
                dt_softplus=True,
            )
        )
    return torch.stack(outs, 1), state


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "position-by-position"])
@pytest.mark.parametrize("limit", [NO_LIMIT, BITES], ids=["no-limit", "limit-bites"])
def test_mamba2_prefill_is_the_decode_steps_bitwise_and_the_chunked_scans_function(limit, fused):
    """Under the mode (its softplus the same function of each element in a prefill's
    (B, T, H) and a decode step's (B, H)), both forms: the fused kernel and the
    position-by-position reference."""
    inputs = _mamba2_inputs()
    scan = mamba2_prefill(m2.mamba2_selective_state_update, lambda: None, fused)
    first = {k: (v[:, :3] if v.dim() > 1 else v) for k, v in inputs.items()}
    rest = {k: (v[:, 3:] if v.dim() > 1 else v) for k, v in inputs.items()}
    with batch_invariant():
        out, final = scan(**inputs, chunk_size=4, dt_softplus=True, dt_limit=limit, return_final_states=True)
        dec, state = _decode(inputs, limit, fused=fused)
        a, mid = scan(**first, chunk_size=4, dt_softplus=True, dt_limit=limit, return_final_states=True)
        b = scan(**rest, chunk_size=4, dt_softplus=True, dt_limit=limit, initial_states=mid)
    assert torch.equal(_bits(out), _bits(dec)) and torch.equal(_bits(final), _bits(state))
    assert torch.equal(_bits(torch.cat([a, b], 1)), _bits(out))
    ref, ref_final = m2.mamba2_chunk_scan(
        **inputs, chunk_size=4, dt_softplus=True, dt_limit=limit, return_final_states=True
    )
    assert (out - ref).abs().max() < 1e-4 and (final - ref_final).abs().max() < 1e-4


def test_transformers_bare_decode_step_skips_the_limit_the_prefill_applies():
    inputs = _mamba2_inputs()
    ref = m2.mamba2_chunk_scan(**inputs, chunk_size=4, dt_softplus=True, dt_limit=BITES)
    bare, _ = _decode(inputs, BITES, step=m2.mamba2_selective_state_update)
    assert (bare - ref).abs().max() > 1e-3  # negative control: the limit bites here


def test_a_gate_given_to_the_mamba2_prefill_is_refused():
    scan = mamba2_prefill(m2.mamba2_selective_state_update, lambda: None)
    inputs = _mamba2_inputs()
    with pytest.raises(ValueError, match="gate z"):
        scan(**inputs, chunk_size=4, z=inputs["hidden_states"])


class _Cache:
    """The recurrent state a transformers cache holds for layer 0 (None: none yet)."""

    def __init__(self) -> None:
        self.state = None

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0):
        return self.state


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "position-by-position"])
def test_mamba_prefill_continues_from_the_cached_state_bitwise(fused):
    """Under the mode (its softplus and silu one function of each element), both forms."""
    g = torch.Generator().manual_seed(1)
    x, dt, z = (_rand(g, BATCH, INNER, T) for _ in range(3))
    A, B, C = -torch.rand(INNER, N, generator=g) - 0.5, _rand(g, BATCH, N, T), _rand(g, BATCH, N, T)
    mixer, cache = SimpleNamespace(D=_rand(g, INNER), layer_idx=0), _Cache()
    bias = _rand(g, INNER)
    call = Call(mixer, cache)
    scan = mamba_prefill(m1.mamba_selective_state_update, lambda: call, fused)

    def run(sl: slice):
        return scan(
            x[..., sl],
            dt[..., sl],
            A,
            B[..., sl],
            C[..., sl],
            D=mixer.D.float(),
            z=z[..., sl],
            delta_bias=bias,
            delta_softplus=True,
            return_last_state=True,
        )

    with batch_invariant():
        whole, last = run(slice(None))
        a, cache.state = run(slice(0, 3))
        b, state = run(slice(3, None))
    ref = m1.mamba_selective_scan(x, dt, A, B, C, D=mixer.D.float(), z=z, delta_bias=bias, delta_softplus=True)
    assert (whole - ref).abs().max() < 1e-4
    assert torch.equal(_bits(torch.cat([a, b], -1)), _bits(whole))
    assert torch.equal(_bits(state), _bits(last))


def test_a_covered_function_called_outside_its_mixer_raises():
    with pytest.raises(RuntimeError, match="outside its mixer's forward"):
        Running()()
