"""Seeded standard normal values by a definition, the same bits on every machine: the
test models' weights (:func:`detsample.models.tiny.seeded_init_`).

Why not ``torch.randn(generator=g)``: torch draws a tensor of 16 or more normals with a
vectorised Box-Muller whose ``log`` / ``cos`` / ``sin`` follow the ATen instruction set
(measured: the tiny Llama's weights hash one way under ATen's AVX2 kernels and another
under ``ATEN_CPU_CAPABILITY=default`` and on aarch64), so "seeded" weights were not one
model across machines.

The definition: parameter ``index`` (its position in ``named_parameters()``) under ``seed``
holds, at elements ``2j`` and ``2j + 1``, the pair of pair counter ``j``::

    w0, w1, w2, w3 = philox4x32(seed, j & 0xffffffff, j >> 32, index, STREAM)   # rng.py's
    u1 = (((w0 << 20) | (w1 >> 12)) + 0.5) * 2**-52      # rules.u52 / rules.uniform: (0, 1)
    u2 = (((w2 << 20) | (w3 >> 12)) + 0.5) * 2**-52
    rho = sqrt(-2 * log64(u1));  theta = TWO_PI * u2      # log64: arith.spec; sqrt: IEEE
    z[2j] = rho * cos(theta);  z[2j + 1] = rho * sin(theta)   # arith.trig, float64

float64 throughout: integer operations and IEEE float64 operations of detsample's
definitions, so the values are exactly standard-normal draws' by Box-Muller, and the
same bits on every CPU, ISA and torch build. Two implementations, equal bit for bit
(tests/models/test_seeded.py): a numba kernel on the host (:mod:`detsample.models.seeded_jit`;
~50 ns a value), and this module's torch composition (where numba is missing).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from detsample import rng, rules
from detsample.arith import cpu as arith_cpu
from detsample.arith import elementary_torch, reference, trig_torch

#: Philox's counter word c3 for weights (other streams may use other values)
STREAM = 0x57454947
#: 2 pi, rounded to float64
TWO_PI = 2.0 * math.pi
#: pairs per torch-composition chunk (bounds its int64 temporaries)
CHUNK_PAIRS = 1 << 18
IMPLS = ("auto", "numba", "torch")


@functools.cache
def _kernel():
    from detsample.models import seeded_jit

    return seeded_jit


def _numba_available() -> bool:
    try:
        _kernel()
    except ImportError:
        return False
    return True


def normals(seed: int, index: int, n: int, *, impl: str = "auto") -> torch.Tensor:
    """``n`` standard normal float64 values of parameter ``index`` under ``seed`` (the
    definition above; CPU tensor)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    for name, v, hi in (("seed", seed, 1 << 64), ("index", index, 1 << 32), ("n", n, 1 << 62)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < hi:
            raise ValueError(f"{name} must be an integer in [0, {hi}), got {v!r}")
    pairs = (n + 1) // 2
    out = torch.empty(2 * pairs, dtype=torch.float64)
    if impl == "numba" or (impl == "auto" and _numba_available()):
        k, o = _kernel().normal_pairs, out.numpy()
        arith_cpu.split_rows(lambda s, e: k(np.uint64(seed), index, STREAM, TWO_PI, s, e, o), pairs, 2 * pairs)
    else:
        for s in range(0, pairs, CHUNK_PAIRS):
            e = min(pairs, s + CHUNK_PAIRS)
            out[2 * s : 2 * e] = _pairs(seed, index, s, e)
    return out[:n]


def _pairs(seed: int, index: int, start: int, stop: int) -> torch.Tensor:
    """The torch composition: pairs ``start .. stop - 1`` as 2 (stop - start) values."""
    j = torch.arange(start, stop, dtype=torch.int64)
    key = torch.tensor(seed - (1 << 64) if seed >= 1 << 63 else seed, dtype=torch.int64)
    w0, w1, w2, w3 = rng.philox4x32(key, j & rng.MASK32, j >> 32, torch.full_like(j, index), torch.full_like(j, STREAM))
    u1 = rules.uniform(rules.u52(w0, w1))
    u2 = rules.uniform(rules.u52(w2, w3))
    rho = elementary_torch.sqrt(reference.log64(u1) * -2.0)
    theta = u2 * TWO_PI
    return torch.stack([rho * trig_torch.cos(theta), rho * trig_torch.sin(theta)], 1).view(-1)
