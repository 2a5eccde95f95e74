"""Kernel-test inputs that are identical on every machine: ``tensor(shape, dtype, seed, family)``.

A golden can only catch a kernel change if the kernel's *inputs* are the same bits on
every machine, ISA and library version. These tensors come from PCG64's raw integer
stream (``random_raw``, stable across numpy versions), exactly rounded IEEE ``+`` and
``*`` in float64, and one IEEE conversion to the target dtype (bfloat16 by integer
round-to-nearest-even on the float32 bits); NaNs are the dtype's canonical quiet NaN.
No distribution method, transcendental function or torch kernel is involved, so the
same arguments give the same bits everywhere (tests/golden/test_synthtensors.py pins
sha256s).

The families are the golden scenarios' (docs/golden.md):

| family | floats | integers |
|---|---|---|
| ``random`` | bell-shaped, std 1 (Irwin-Hall of 4 uniforms) | uniform in [-1000, 1000] (clipped to the dtype) |
| ``ties`` | only {0, 0.5, 1, 1.5}: every value tied | only {0, 1, 2, 3} |
| ``huge`` | magnitudes up to the dtype's largest finite value | near the dtype's min and max |
| ``neginf`` | ``random`` with ~30% ``-inf`` | (floats only) |
| ``nan`` | ``random`` with ~10% NaN, ~2% ``+inf``, ~2% ``-inf`` | (floats only) |

bool tensors take ``random`` only (fair bits).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from detsample.golden import bits as B

FAMILIES = ("random", "ties", "huge", "neginf", "nan")
_FLOAT_ONLY = ("neginf", "nan")
_TAG = 0x7E45  # keeps these streams apart from the scenario logits'
_TWO_M53 = 2.0**-53
_QNAN = {"float64": 0x7FF8000000000000, "float32": 0x7FC00000, "float16": 0x7E00, "bfloat16": 0x7FC0}
_MAX = {
    "float64": np.finfo(np.float64).max,
    "float32": float(np.finfo(np.float32).max),
    "float16": float(np.finfo(np.float16).max),
    "bfloat16": float(np.uint32(0x7F7F0000).view(np.float32)),
}


def _raw(seed: int, stream: int, n: int) -> np.ndarray:
    """[n] uint64 from PCG64's raw stream keyed by (seed, stream)."""
    return np.random.PCG64(np.random.SeedSequence([seed, stream, _TAG])).random_raw(n)


def _unit(seed: int, stream: int, n: int) -> np.ndarray:
    """[n] float64 uniforms in [0, 1), 53 random bits each."""
    return (_raw(seed, stream, n) >> np.uint64(11)).astype(np.float64) * _TWO_M53


def _bell(seed: int, n: int) -> np.ndarray:
    """[n] float64, approximately normal with std 1 (Irwin-Hall of 4 uniforms)."""
    u = _unit(seed, 0, 4 * n).reshape(4, n)
    return ((u[0] + u[1]) + (u[2] + u[3]) - 2.0) * 1.7320508075688772


def _float_bits(v: np.ndarray, dt: B.DType) -> np.ndarray:
    """float64 values -> bit patterns of ``dt`` by one IEEE conversion (bfloat16: RNE
    on the float32 bits); NaNs become the canonical quiet NaN."""
    if dt.name == "bfloat16":
        b = v.astype(np.float32).view(np.uint32)
        out = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        out = out.astype(np.uint16)
    else:
        out = v.astype(f"<f{dt.width // 8}").view(dt.storage)
    return np.where(np.isnan(v), dt.storage.type(_QNAN[dt.name]), out).astype(dt.storage)


def _floats(family: str, seed: int, n: int, dt: B.DType) -> np.ndarray:
    if family == "ties":
        return np.floor(_unit(seed, 1, n) * 4.0) * 0.5
    if family == "huge":
        return np.clip(_bell(seed, n) / 3.5, -1.0, 1.0) * _MAX[dt.name]
    v = _bell(seed, n)
    u = _unit(seed, 2, n)
    if family == "neginf":
        v[u < 0.3] = -np.inf
    elif family == "nan":
        v[u < 0.1] = np.nan
        v[(u >= 0.1) & (u < 0.12)] = np.inf
        v[(u >= 0.12) & (u < 0.14)] = -np.inf
    return v


def _ints(family: str, seed: int, n: int, dt: B.DType) -> np.ndarray:
    """Bit patterns of integers of ``dt`` (computed in Python-int-safe steps)."""
    info = np.iinfo(f"<{'i' if dt.kind == 'int' else 'u'}{dt.width // 8}")
    raw = _raw(seed, 3, n)
    vals = dt.values(np.zeros(n, dt.storage)).copy()
    if family == "ties":
        vals[:] = (raw % np.uint64(4)).astype(vals.dtype)
    elif family == "random":
        lo, hi = max(int(info.min), -1000), min(int(info.max), 1000)
        vals[:] = ((raw % np.uint64(hi - lo + 1)).astype(np.int64) + lo).astype(vals.dtype)
    else:  # huge: within 2**(width - 2) (at most 1000) of the min or the max
        off = (raw >> np.uint64(1)) % np.uint64(min(1000, 2 ** (dt.width - 2)))
        top = np.uint64(int(info.max)) - off
        if dt.kind == "uint":
            vals[:] = top.astype(vals.dtype)
        else:
            low = (off.astype(np.int64) + int(info.min)).astype(vals.dtype)
            vals[:] = np.where((raw & np.uint64(1)) == 1, top.astype(vals.dtype), low)
    return vals.view(dt.storage)


def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.float32`` / ``"float32"`` -> ``"float32"`` (ValueError when unsupported)."""
    name = str(dtype).removeprefix("torch.")
    return B.dtype(name).name


def tensor_bits(shape: Sequence[int], dtype: torch.dtype | str, seed: int, family: str = "random") -> np.ndarray:
    """The bit patterns (C order, ``dtype``'s storage, little-endian) of :func:`tensor`."""
    dt = B.dtype(dtype_name(dtype))
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise ValueError(f"shape must be non-negative integers, got {shape!r}")
    n = int(np.prod(dims, dtype=np.int64))
    if dt.kind == "bool":
        if family != "random":
            raise ValueError(f"family {family!r} needs a numeric dtype, got bool (use 'random')")
        return (_raw(int(seed), 4, n) & np.uint64(1)).astype(dt.storage).reshape(dims)
    if not dt.is_float and family in _FLOAT_ONLY:
        raise ValueError(f"family {family!r} needs a floating dtype, got {dt.name}")
    if dt.is_float:
        return _float_bits(_floats(family, int(seed), n, dt), dt).reshape(dims)
    return _ints(family, int(seed), n, dt).reshape(dims)


def tensor(
    shape: Sequence[int] | int,
    dtype: torch.dtype | str = torch.float32,
    seed: int = 0,
    family: str = "random",
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """A fresh ``shape`` tensor of ``dtype`` (float64/32/16, bfloat16, signed or
    unsigned integers, bool) on ``device``, whose bits depend only on
    ``(shape, dtype, seed, family)``: identical on every machine (module docstring).
    ValueError names a bad shape, dtype, seed or family."""
    b = tensor_bits(shape, dtype, seed, family)
    dt = B.dtype(dtype_name(dtype))
    if dt.name == "bfloat16":
        t = torch.from_numpy(b.view(np.int16).copy()).view(torch.bfloat16)
    else:
        t = torch.from_numpy(dt.values(b).copy())
    return t.to(device)
