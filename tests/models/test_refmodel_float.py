"""RefModelFloat: the reference architecture on float kernels, a known-variant control.

Pins: the control silently becoming exact (then the probe's negative control proves
nothing) or wrong (a padding bug: a row attending to its neighbours or to pad slots).
"""

from __future__ import annotations

import torch

from detsample.models import RefModelFloat, RefModelLM, prefill


def test_close_to_the_int64_model_but_not_batch_invariant():
    ref, flt = RefModelLM(), RefModelFloat()
    seq = list(range(40, 90))
    exact = prefill(ref, seq)
    alone = prefill(flt, seq)
    assert (alone - exact).abs().max().item() < 0.2  # same model; int64 quantises each step
    others = [[7] * 3, list(range(100, 160)), [9, 8]]
    rows = flt.forward([flt.new_cache() for _ in range(4)], [others[0], seq, others[1], others[2]])
    assert (rows[1] - alone).abs().max().item() < 1e-4
    # decode (one row per call) vs the prefill: torch's kernels round it differently
    cache = flt.new_cache()
    prefill(flt, seq[:-1], cache)
    last = flt.forward([cache], [seq[-1:]])[0][0]
    assert (last - alone[-1]).abs().max().item() < 1e-4
    assert not torch.equal(last, alone[-1]), "float kernels became batch-invariant here"
