"""Seeded test weights by a definition (detsample/models/seeded.py): the numba kernel, the
torch composition and the Python oracle give the same bits; the values are standard
normal; the tiny models' weights keep their per-kind scales and do not depend on torch's
random number generator.

Pins: a Philox word or stream out of place, a uniform that can be 0 (an infinite log), a
Box-Muller that drifts from the definition, and weights drawn by ``torch.randn`` again
(tests/invariant/test_portable_isa.py shows those follow ATen's instruction set).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from detsample.models.seeded import normals
from detsample.models.tiny import build_tiny
from oracles import seeded as oracle


@pytest.mark.parametrize(
    "seed,index,n", [(0, 0, 1), (0, 0, 1001), (7, 3, 20_000), (2**64 - 1, 5, 17), (2**63 + 5, 2**32 - 1, 33)]
)
def test_numba_torch_and_the_oracle_give_one_set_of_bits(seed, index, n):
    a = normals(seed, index, n, impl="numba")
    b = normals(seed, index, n, impl="torch")
    assert a.shape == (n,) and a.dtype == torch.float64
    assert torch.equal(a.view(torch.int64), b.view(torch.int64))
    k = min(n, 301)
    assert np.array_equal(a[:k].numpy().view(np.int64), oracle.normals(seed, index, k).view(np.int64))


def test_the_values_are_standard_normal_and_streams_differ():
    z = normals(11, 0, 200_000).numpy()
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert not np.array_equal(z[:100], normals(11, 1, 100).numpy())
    assert not np.array_equal(z[:100], normals(12, 0, 100).numpy())
    assert np.array_equal(z[:100], normals(11, 0, 100).numpy())  # a prefix of the stream


def test_threads_change_no_bit():
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = normals(3, 4, 300_001)
        torch.set_num_threads(3)
        assert torch.equal(normals(3, 4, 300_001), one)
    finally:
        torch.set_num_threads(prev)


def test_tiny_weights_keep_their_scales_and_ignore_torchs_rng():
    torch.manual_seed(123)
    m = build_tiny("hf-tiny-llama")
    torch.manual_seed(456)
    again = build_tiny("hf-tiny-llama")
    for (name, p), (_, q) in zip(m.named_parameters(), again.named_parameters()):
        assert torch.equal(p, q), name
    p = {k: v.detach() for k, v in m.named_parameters()}
    assert abs(float(p["model.embed_tokens.weight"].std()) - 0.15) < 0.005
    assert abs(float(p["model.layers.0.mlp.up_proj.weight"].std()) - 0.05) < 0.002
    gain = p["model.layers.0.input_layernorm.weight"]
    assert abs(float(gain.mean()) - 1) < 0.03 and abs(float(gain.std()) - 0.1) < 0.03
    assert not torch.equal(m.model.embed_tokens.weight, build_tiny("hf-tiny-llama", seed=1).model.embed_tokens.weight)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="seed must be an integer"):
        normals(-1, 0, 3)
    with pytest.raises(ValueError, match="index must be an integer"):
        normals(0, 2**32, 3)
    with pytest.raises(ValueError, match="impl must be one of"):
        normals(0, 0, 3, impl="randn")
