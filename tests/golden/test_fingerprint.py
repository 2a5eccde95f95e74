"""Tests of detsample/fingerprint.py."""

from __future__ import annotations

import pytest
import torch

from detsample.golden.fingerprint import platform_fingerprint, platform_info


def test_cpu_fingerprint_names_device_isa_and_torch():
    """Bug pinned: goldens of one ISA (avx512) compared on another (avx2)."""
    fp = platform_fingerprint("cpu")
    isa = torch.backends.cpu.get_cpu_capability().lower()
    assert fp == f"cpu-{isa}-torch{torch.__version__.lower()}"
    assert platform_info("cpu")["isa"] == isa


@pytest.mark.parametrize("dev", ["meta", "mps", "tpu", 3.5])
def test_unknown_device_rejected(dev):
    with pytest.raises(ValueError, match="device must be"):
        platform_info(dev)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
def test_cuda_unavailable_rejected():
    with pytest.raises(ValueError, match="no CUDA"):
        platform_info("cuda")
