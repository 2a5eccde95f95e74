"""Platform fingerprint: which folder of ``golden/`` applies to this machine.

Bits are only promised "on one device kind and one library version" (docs/guarantees.md), so
golden files are keyed by what changes kernel rounding:

- the device kind (``cpu`` or ``cuda``),
- on CPU the instruction set torch dispatches its vector kernels to
  (``torch.backends.cpu.get_cpu_capability()``: ``avx512``, ``avx2``, ``default``...),
  on CUDA the compute capability (``sm90``),
- the torch version (``2.13.0+cpu``).

Example: ``cpu-avx512-torch2.13.0+cpu``. The fingerprint is a pure function of the
running process; nothing is cached or written.
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
