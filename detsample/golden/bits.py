"""Raw bits of numbers, per dtype: what golden files store and compare.

Golden comparison is on bits, never on tolerances. This module knows, for every dtype a
golden can hold (float64/32/16, bfloat16, signed and unsigned integers, bool), how wide
its bit pattern is, how to print one element (hex bits plus a decimal for humans), and
how far apart two patterns are:

- floats: in ULPs of that dtype (the distance between the patterns mapped to integers
  that are monotonic in the value), so ``+0.0`` vs ``-0.0`` is 0 ULP although the bits
  differ, and a NaN on either side has no distance (its own histogram bucket);
- integers: the absolute difference of the values (one unit = one ULP);
- bool: 1 for a flipped element.

Everything here is a pure function of numpy arrays; bfloat16 (which numpy lacks) is
handled as its uint16 bit patterns, its value being the float32 with those bits on top.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    """One storable dtype: ``name`` (torch spelling), ``kind`` float / int / uint / bool,
    ``width`` in bits, ``storage`` the little-endian unsigned numpy dtype of its bits,
    and for floats the exponent / mantissa widths."""

    name: str
    kind: str
    width: int
    exp_bits: int = 0
    man_bits: int = 0

    @property
    def storage(self) -> np.dtype:
        return np.dtype(f"<u{self.width // 8}")

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def hex_digits(self) -> int:
        return self.width // 4

    def values(self, bits: np.ndarray) -> np.ndarray:
        """The numpy values of ``bits`` (bfloat16: float32, exactly)."""
        if self.name == "bfloat16":
            return (bits.astype("<u4") << np.uint32(16)).view("<f4")
        if self.kind == "bool":
            return bits != 0
        numpy_name = {"float": "f", "int": "i", "uint": "u"}[self.kind]
        return bits.view(f"<{numpy_name}{self.width // 8}")


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("float64", "float", 64, 11, 52),
        DType("float32", "float", 32, 8, 23),
        DType("float16", "float", 16, 5, 10),
        DType("bfloat16", "float", 16, 8, 7),
        DType("int64", "int", 64),
        DType("int32", "int", 32),
        DType("int16", "int", 16),
        DType("int8", "int", 8),
        DType("uint64", "uint", 64),
        DType("uint32", "uint", 32),
        DType("uint16", "uint", 16),
        DType("uint8", "uint", 8),
        DType("bool", "bool", 8),
    )
}
FLOAT32 = DTYPES["float32"]


def dtype(name: str) -> DType:
    """The :class:`DType` called ``name`` (ValueError naming the supported ones)."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}") from None


def is_nan(bits: np.ndarray, dt: DType) -> np.ndarray:
    """Elementwise: the pattern is a NaN (any payload, either sign). False for non-floats."""
    if not dt.is_float:
        return np.zeros(bits.shape, dtype=bool)
    b = bits.astype(np.uint64)
    exp = np.uint64((1 << dt.exp_bits) - 1) << np.uint64(dt.man_bits)
    man = np.uint64((1 << dt.man_bits) - 1)
    return ((b & exp) == exp) & ((b & man) != 0)


def is_zero(bits: np.ndarray, dt: DType) -> np.ndarray:
    """Elementwise: a float pattern is +0.0 or -0.0. False for non-floats."""
    if not dt.is_float:
        return np.zeros(bits.shape, dtype=bool)
    return (bits.astype(np.uint64) & np.uint64((1 << (dt.width - 1)) - 1)) == 0


def _key(bits: np.ndarray, dt: DType) -> np.ndarray:
    """Integers monotonic in the value: int64 for floats and signed ints, uint64 else."""
    if dt.is_float:
        b = bits.astype(np.uint64)
        sign = (b >> np.uint64(dt.width - 1)) != 0
        mag = (b & np.uint64((1 << (dt.width - 1)) - 1)).astype(np.int64)
        return np.where(sign, -mag, mag)
    if dt.kind == "int":
        return dt.values(bits).astype(np.int64)
    return dt.values(bits).astype(np.uint64)


def distance(golden_bits: np.ndarray, obtained_bits: np.ndarray, dt: DType) -> np.ndarray:
    """Elementwise uint64 distance: ULPs for floats, value units for integers, 1 for a
    flipped bool. Meaningless (0) where :func:`is_nan` holds on either side."""
    a, b = _key(golden_bits, dt), _key(obtained_bits, dt)
    # max - min wraps correctly in uint64: the true difference is always < 2**64.
    return np.maximum(a, b).astype(np.uint64) - np.minimum(a, b).astype(np.uint64)


def value_text(bits: int, dt: DType) -> str:
    """Decimal text of one element: the shortest that round-trips to its dtype
    (bfloat16: to float32, which holds it exactly), ``true``/``false`` for bool."""
    arr = np.array([bits], dtype=dt.storage)
    if dt.kind == "bool":
        return "true" if bits else "false"
    v = dt.values(arr)[0]
    return str(v) if dt.is_float else str(int(v))


def hex_text(bits: int, dt: DType) -> str:
    """``0x`` and the bit pattern in ``width / 4`` hex digits."""
    return f"0x{int(bits):0{dt.hex_digits}x}"


# -- histograms of distances --------------------------------------------------------------
NAN_BUCKET = "NaN"
ZERO_BUCKET = "0 (sign of zero)"
_MAX_POW = 16


def bucket(d: int) -> str:
    """Histogram bucket of a distance (``d < 0``: a NaN was involved)."""
    if d < 0:
        return NAN_BUCKET
    if d == 0:
        return ZERO_BUCKET
    if d <= 2:
        return str(d)
    for k in range(2, _MAX_POW + 1):
        if d <= 2**k:
            return f"{2 ** (k - 1) + 1}-{2**k}"
    return f">{2**_MAX_POW}"


_EDGES = np.array([0, 1, 2] + [2**k for k in range(2, _MAX_POW + 1)], dtype=np.uint64)
_NAMES = [bucket(int(e)) for e in _EDGES] + [f">{2**_MAX_POW}"]


def histogram(distances: np.ndarray, nan: np.ndarray | None = None) -> dict[str, int]:
    """Bucket counts of ``distances`` (uint64; where ``nan`` holds: the NaN bucket), in
    increasing order of distance, empty buckets left out."""
    d = np.asarray(distances, dtype=np.uint64).reshape(-1)
    idx = np.searchsorted(_EDGES, d, side="left")
    counts = np.bincount(idx, minlength=len(_NAMES) + 1)
    if nan is not None:
        nan = np.asarray(nan, dtype=bool).reshape(-1)
        counts -= np.bincount(idx[nan], minlength=len(_NAMES) + 1)
        counts[-1] = int(nan.sum())
    names = _NAMES + [NAN_BUCKET]
    return {names[i]: int(c) for i, c in enumerate(counts) if c}
