"""Shared steps of the tensor-parallel model tests: a spec run at TP=1 here and on a rank
group, with a negative-control job on the same group, compared bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from detsample.models import load_model
from detsample.parallel import TPModelSpec, tp_group
from detsample.probe.model import ProbeConfig
from detsample.probe.parallel import forwards, job_forwards

CFG = ProbeConfig(prompt_len=12, neighbours=(5, 17, 3), chunks=(5,), localize=True)
START = "fork"  # ranks without re-importing torch (test_group.py covers the default, spawn)
PARTS = ("prefill", "batch", "decode")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def tp_runs(spec: str, tp: int, control: Callable[..., Any], *args: Any) -> tuple[dict, dict, Any]:
    """``(want, got, ctl)``: the probe's forwards at TP=1 (this process, portable mode) and
    at ``tp`` ranks, and ``control(lm, comm, *args)`` run on the same ranks afterwards."""
    want = forwards(load_model(spec, batch_invariant=True, portable=True), CFG)
    with tp_group(TPModelSpec(spec, tp, True, True), timeout=180, start_method=START) as g:
        got = g.call(job_forwards, CFG)
        ctl = g.call(control, *args)
    return want, got, ctl


def assert_bitwise(got: dict, want: dict) -> None:
    for part in PARTS:
        assert got[part].shape == want[part].shape, part
        assert torch.equal(bits(got[part]), bits(want[part])), part
