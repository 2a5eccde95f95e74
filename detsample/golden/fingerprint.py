"""Which folder of ``golden/`` applies to this machine: keyed by what changes bits, and
only that.

* :func:`golden_key` -- the scenarios' goldens (the sampler, the reference engine, a model
  under the portable batch-invariant mode). On CPU their bits are defined by detsample's
  own arithmetic (:mod:`detsample.arith`: exp, log and exact sums; the rest are exact or
  single IEEE operations), so nothing of the machine enters: one folder, ``cpu``, for
  every CPU (x86 of any ISA, MKL path or vendor, aarch64), thread count and torch build
  (``+cpu``, ``+cu130``, none). On CUDA the Triton kernels implement the same definition,
  but that a GPU gives the CPU's bits is verified only on a GPU (ci/gpu-check.sh), so a
  CUDA device keeps its platform fingerprint.
* :func:`platform_fingerprint` -- tensor goldens (a user's own kernels, whose bits are
  the platform's): the device kind, on CPU the instruction set torch dispatches its
  vector kernels to (``torch.backends.cpu.get_cpu_capability()``: ``avx512``, ``avx2``,
  ``default``...), on CUDA the compute capability (``sm90``), and the torch version,
  e.g. ``cpu-avx512-torch2.13.0+cpu``.

Both are pure functions of the running process; nothing is cached or written.
"""

from __future__ import annotations

import re
from typing import Any

import torch

_SAFE = re.compile(r"[^A-Za-z0-9.+_-]")


def _clean(s: str) -> str:
    return _SAFE.sub("_", s.strip().lower())


def check_device(device: str | torch.device = "cpu") -> torch.device:
    """``device`` as a torch.device; ValueError unless it is cpu or an available cuda."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {str(device)!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {str(device)!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device must be available, got {str(device)!r} (no CUDA)")
    return dev


def platform_info(device: str | torch.device = "cpu") -> dict[str, Any]:
    """The facts the fingerprint is made of, for manifests and reports.

    Raises :class:`ValueError` for a device kind other than cpu/cuda, or a cuda device
    when CUDA is not available.
    """
    dev = check_device(device)
    info: dict[str, Any] = {"device": dev.type, "torch": torch.__version__}
    if dev.type == "cpu":
        info["isa"] = _clean(torch.backends.cpu.get_cpu_capability())
    else:
        major, minor = torch.cuda.get_device_capability(dev)
        info["isa"] = f"sm{major}{minor}"
        info["gpu"] = torch.cuda.get_device_name(dev)
    return info


def platform_fingerprint(device: str | torch.device = "cpu") -> str:
    """The golden folder name of this platform, e.g. ``cpu-avx512-torch2.13.0+cpu``."""
    info = platform_info(device)
    return f"{info['device']}-{info['isa']}-torch{_clean(info['torch'])}"


#: the golden folder of every CPU's scenario goldens
CPU_KEY = "cpu"


def golden_key(device: str | torch.device = "cpu") -> str:
    """The golden folder of the scenarios on ``device``: ``cpu`` on any CPU (the bits are
    detsample's definition, the same everywhere), the :func:`platform_fingerprint` on
    CUDA (a GPU's agreement with the CPU is the aim, verified only on a GPU)."""
    dev = check_device(device)
    return CPU_KEY if dev.type == "cpu" else platform_fingerprint(dev)
