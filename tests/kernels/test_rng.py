"""detsample.kernels.rng: the uniforms drawn by tl.philox equal detsample.rng bit for bit."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.rng import row_uniforms

SPECIAL = [  # (seed, position): word boundaries of the key and of the counter
    (0, 0),
    (2**63 - 1, 2**62),
    (2**32 - 1, 2**32 - 1),
    (2**32, 2**32),
    (1, 2**40 + 7),
]


def run_uniforms(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    from detsample.kernels.rng import row_uniforms as kernel_uniforms

    return kernel_uniforms(seeds, positions)


def test_special_counters_bit_equal(interp):
    """Bug it pins: a counter word taken from the wrong half of the 64-bit position, or a
    seed split into the wrong key words, changes every draw on the GPU."""
    seeds = torch.tensor([s for s, _ in SPECIAL])
    pos = torch.tensor([p for _, p in SPECIAL])
    got = interp(run_uniforms, seeds, pos)
    assert torch.equal(got.view(torch.int64), row_uniforms(seeds, pos).view(torch.int64))
    assert bool(((got > 0) & (got < 1)).all())


@settings(max_examples=8)
@given(st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**62)), min_size=1, max_size=300))
def test_uniforms_bit_equal_to_rng(interp, pairs):
    """Any batch of (seed, position): the kernel's float64 bits equal detsample.rng's."""
    seeds = torch.tensor([s for s, _ in pairs])
    pos = torch.tensor([p for _, p in pairs])
    got = interp(run_uniforms, seeds, pos)
    assert torch.equal(got.view(torch.int64), row_uniforms(seeds, pos).view(torch.int64))


@pytest.mark.gpu
def test_uniforms_bit_equal_on_cuda(cuda):
    g = torch.Generator().manual_seed(3)
    seeds = torch.randint(0, 2**62, (4096,), generator=g)
    pos = torch.randint(0, 2**40, (4096,), generator=g)
    got = run_uniforms(seeds.to(cuda), pos.to(cuda)).cpu()
    assert torch.equal(got.view(torch.int64), row_uniforms(seeds, pos).view(torch.int64))
