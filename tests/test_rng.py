"""Philox4x32-10 against known-answer vectors, the oracle and Triton's tl.philox."""

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample.rng import philox4x32, row_uniforms
from oracles import rng as orng

# Random123 known-answer tests for philox4x32_10: (key as seed, counter) -> output
KAT = [
    (0, (0, 0, 0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (2**64 - 1, (0xFFFFFFFF,) * 4, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        0x299F31D0A4093822,
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("seed,ctr,want", KAT)
def test_known_answers(seed, ctr, want):
    assert orng.philox4x32(seed, *ctr) == want
    s = torch.tensor(seed - 2**64 if seed >= 2**63 else seed, dtype=torch.int64)
    got = philox4x32(s, *(torch.tensor(c) for c in ctr))
    assert tuple(int(g) for g in got) == want


@given(st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**40)), min_size=1, max_size=16))
def test_row_uniforms_match_oracle_bitwise(pairs):
    seeds = torch.tensor([s for s, _ in pairs])
    pos = torch.tensor([p for _, p in pairs])
    u = row_uniforms(seeds, pos)
    assert u.tolist() == [orng.row_uniform(s, p) for s, p in pairs]
    assert bool(((u > 0) & (u < 1)).all())


def test_uniforms_never_reach_zero_or_one():
    """A hash of 0xFFFFFFFF must not become u == 1 (an infinite Gumbel / a forced token,
    SGLang 25106), and a hash of 0 must not become u == 0."""
    n_max = (2**52 - 1 + 0.5) * 2.0**-52
    n_min = 0.5 * 2.0**-52
    assert n_min > 0.0 and n_max < 1.0


def test_uniform_depends_only_on_seed_and_position():
    u1 = row_uniforms(torch.tensor([5, 5, 9]), torch.tensor([3, 4, 3]))
    u2 = row_uniforms(torch.tensor([9, 5]), torch.tensor([3, 3]))
    assert u1[0] == u2[1] and u1[2] == u2[0] and u1[0] != u1[1]


TRITON_SCRIPT = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
from detsample.rng import philox4x32

@triton.jit
def k(seed_ptr, c0_ptr, c1_ptr, o0, o1, o2, o3, N: tl.constexpr):
    i = tl.arange(0, N)
    seed = tl.load(seed_ptr)
    c0 = tl.load(c0_ptr + i).to(tl.uint32)
    c1 = tl.load(c1_ptr + i).to(tl.uint32)
    z = c0 * 0
    a, b, c, d = tl.philox(seed, c0, c1, z, z)
    tl.store(o0 + i, a.to(tl.int64)); tl.store(o1 + i, b.to(tl.int64))
    tl.store(o2 + i, c.to(tl.int64)); tl.store(o3 + i, d.to(tl.int64))

N = 16
seed = torch.tensor([0x299F31D0A4093822], dtype=torch.int64)
c0 = torch.arange(N, dtype=torch.int64) * 2654435761 % 2**32
c1 = torch.arange(N, dtype=torch.int64) * 7
outs = [torch.zeros(N, dtype=torch.int64) for _ in range(4)]
k[(1,)](seed, c0, c1, *outs, N=N)
ref = philox4x32(seed, c0, c1, c1 * 0, c1 * 0)
sys.exit(0 if all(torch.equal(o & 0xFFFFFFFF, r) for o, r in zip(outs, ref)) else 1)
"""


def test_same_bits_as_triton_philox():
    """Our CPU Philox is laid out as Triton's tl.philox, so a GPU kernel draws the same
    bits (checked with TRITON_INTERPRET=1 in a subprocess: the flag is read at import)."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", TRITON_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


@given(st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1)), min_size=1, max_size=64))
def test_host_rounds_equal_tensor_rounds(pairs):
    """CPU tensors take the rounds in the 64-bit lanes of one Python int (instead of ~150
    tensor operations per call); the bits equal the tensor rounds (the form a GPU runs)
    and the oracle, whatever the seeds and positions (the full 63 bits: a carry or a
    shift crossing lanes would show)."""
    import numpy as np

    from detsample.rng import MASK32, STREAM_DRAW
    from detsample.rules import U_SCALE

    seeds = torch.tensor([s for s, _ in pairs])
    pos = torch.tensor([p for _, p in pairs])
    w0, w1, _, _ = philox4x32(
        seeds, pos & MASK32, (pos >> 32) & MASK32, torch.full_like(pos, STREAM_DRAW), torch.zeros_like(pos)
    )
    want = (((w0 << 20) | (w1 >> 12)).to(torch.float64) + 0.5) * U_SCALE
    got = row_uniforms(seeds, pos)
    assert got.dtype == torch.float64 and torch.equal(got, want)
    assert got.tolist() == [orng.row_uniform(s, p) for s, p in pairs]
    assert np.all((got.numpy() > 0) & (got.numpy() < 1))


@pytest.mark.parametrize("n", [0, 1, 2, 17, 64, 256, 257, 1000])
def test_the_host_rounds_at_every_batch_size(n):
    """One row to a few hundred: the oracle's bits, with seeds and positions using all 63
    bits."""
    seeds = torch.tensor([(2**63 - 1 - 977 * i) for i in range(n)])
    pos = torch.tensor([2**40 + 3 * i for i in range(n)])
    got = row_uniforms(seeds, pos)
    assert got.tolist() == [orng.row_uniform(int(s), int(p)) for s, p in zip(seeds, pos)]
