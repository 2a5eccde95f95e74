"""detsample.kernels.prepare: sanitising, row max and temperature, bit-equal to the torch ops."""

import numpy as np
import pytest
import torch

from detsample.ops.sanitize import sanitize_rows_flagged
from detsample.ops.temperature import scale_logits
from tests.helpers import logits_rows

FAMILIES = ["random", "nan", "neginf", "huge", "mixed", "ties"]
SHAPES = [(5, 1000), (3, 4096), (2, 17)]


def run_prepare(x: torch.Tensor, t: torch.Tensor):
    from detsample.kernels import prepare

    clean, status, m = prepare.sanitize_rows(x)
    m0 = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    z = prepare.scale_logits(clean, m0, t)
    alone = [prepare.sanitize_rows(x[i : i + 1]) for i in range(x.shape[0])]
    z_alone = [prepare.scale_logits(clean[i : i + 1], m0[i : i + 1], t[i : i + 1]) for i in range(x.shape[0])]
    return clean, status, m, z, clean is x, alone, z_alone


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_bit_equal_to_torch_ops_and_row_invariant(interp, family, shape):
    """The Triton twins of steps 2 and 7 are exact operations: the sanitised logits, the
    status flags, the row maxima and the scaled logits equal the torch ops' bits, and a
    row alone gives the same bits as in the batch. Bug it pins: a division by a
    reciprocal (not IEEE), or a NaN/+inf left in a row, would move the row's max off 0."""
    B, V = shape
    rng = np.random.default_rng(hash((family, shape)) % 2**32)
    x = torch.from_numpy(logits_rows(rng, B, V, family))
    t = torch.from_numpy(rng.choice([0.05, 0.7, 1.0, 3.3], size=(B, 1)).astype(np.float32))
    clean, status, m, z, same, alone, z_alone = interp(run_prepare, x, t)
    c0, s0, m_0, _ = sanitize_rows_flagged(x)
    assert torch.equal(clean.view(torch.int32), c0.view(torch.int32))
    assert torch.equal(status, s0) and torch.equal(m.view(torch.int32), m_0.view(torch.int32))
    assert same == (c0 is x)  # no copy unless a row had NaN or +inf
    m0 = torch.where(torch.isneginf(m_0), torch.zeros_like(m_0), m_0)
    assert torch.equal(z.view(torch.int32), scale_logits(c0, m0, t).view(torch.int32))
    for i in range(B):
        assert torch.equal(alone[i][0].view(torch.int32), clean[i : i + 1].view(torch.int32))
        assert torch.equal(alone[i][1], status[i : i + 1])
        assert torch.equal(z_alone[i].view(torch.int32), z[i : i + 1].view(torch.int32))
