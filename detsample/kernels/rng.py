"""The per-row uniforms of :mod:`detsample.rng`, drawn by ``tl.philox`` on the device.

Same counters as :func:`detsample.rng.row_uniforms`: ``tl.philox(seed, pos & 0xffffffff,
pos >> 32, STREAM_DRAW, 0)``, 52 bits ``(w0 << 20) | (w1 >> 12)``, ``u = (n + 0.5) *
2**-52`` in float64. Bit-equal to the torch implementation (tests/kernels/test_rng.py),
so a row draws the same token whichever backend produced its uniform.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from detsample.kernels.common import OPTS, check_device, uniform
from detsample.rng import STREAM_DRAW

_BLOCK = 128


@triton.jit
def _uniforms_kernel(seed_ptr, pos_ptr, out_ptr, N, STREAM: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    seed = tl.load(seed_ptr + idx, mask=idx < N, other=0)
    pos = tl.load(pos_ptr + idx, mask=idx < N, other=0)
    c0 = (pos & 0xFFFFFFFF).to(tl.uint32)
    c1 = ((pos >> 32) & 0xFFFFFFFF).to(tl.uint32)
    zero = c0 * 0
    w0, w1, _, _ = tl.philox(seed, c0, c1, zero + STREAM, zero)
    tl.store(out_ptr + idx, uniform(w0, w1), mask=idx < N)


def row_uniforms(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """seeds, positions: (batch,) int64 (non-negative) on one device -> (batch,) float64
    in (0, 1), bit-equal to :func:`detsample.rng.row_uniforms`."""
    check_device(seeds.device)
    seeds = seeds.to(torch.int64).contiguous()
    positions = positions.to(device=seeds.device, dtype=torch.int64).contiguous()
    n = seeds.numel()
    out = torch.empty((n,), dtype=torch.float64, device=seeds.device)
    if n:
        _uniforms_kernel[(triton.cdiv(n, _BLOCK),)](seeds, positions, out, n, STREAM=STREAM_DRAW, BLOCK=_BLOCK, **OPTS)
    return out
