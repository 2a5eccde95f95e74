"""Bitwise comparison of tensor goldens, and the report a kernel developer reads.

Per tensor: a dtype or shape change, or else how many elements moved (bits differ),
the first moved index, a histogram of distances in the dtype's own units (float32 ULPs
for a float32 tensor, bfloat16 ULPs for a bfloat16 one, value units for integers,
flips for bool), the worst elements, and the changes that a float comparison would
miss: NaN payloads (NaN on both sides, other bits) and the sign of zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from detsample.golden import bits as B
from detsample.golden.tensor_format import StoredTensor


@dataclass(frozen=True)
class Moved:
    """One element whose bits differ: ``index`` (a tuple), the two patterns and their
    distance (-1 when a NaN is involved)."""

    index: tuple[int, ...]
    golden_bits: int
    obtained_bits: int
    distance: int

    def describe(self, dt: B.DType) -> str:
        unit = "ulp" if dt.is_float else ("flip" if dt.kind == "bool" else "unit" if self.distance == 1 else "units")
        how = (
            "NaN involved"
            if self.distance < 0
            else ("sign of zero" if self.distance == 0 else f"{self.distance} {unit}")
        )
        g, o = self.golden_bits, self.obtained_bits
        return (
            f"[{','.join(map(str, self.index))}]: {B.hex_text(g, dt)} ({B.value_text(g, dt)})"
            f" -> {B.hex_text(o, dt)} ({B.value_text(o, dt)}), {how}"
        )


@dataclass(frozen=True)
class TensorDiff:
    """One tensor of a golden compared; ``ok`` iff it exists on both sides with equal
    dtype, shape and bits. ``problem`` names a missing side, a dtype or a shape change."""

    tensor: str
    golden: str | None  # "float32 [4, 8]" or None when only obtained has it
    obtained: str | None
    problem: str | None = None
    numel: int = 0
    moved: int = 0
    first: Moved | None = None
    histogram: dict[str, int] = field(default_factory=dict)
    worst: tuple[Moved, ...] = ()
    nan_payload: int = 0  # NaN on both sides, other payload or sign
    nan_changed: int = 0  # NaN on exactly one side
    zero_sign: int = 0  # +0.0 <-> -0.0
    dtype: B.DType | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and self.moved == 0

    def lines(self) -> list[str]:
        """The report of this tensor (empty when ok)."""
        if self.ok:
            return []
        if self.problem is not None:
            return [f"  {self.tensor}: {self.problem}"]
        dt = self.dtype
        assert dt is not None and self.first is not None
        out = [
            f"  {self.tensor}: {self.golden}: {self.moved} of {self.numel} elements moved",
            f"    first moved element: {self.first.describe(dt)}",
        ]
        if dt.kind != "bool":
            what = f"ULP histogram ({dt.name} ULPs)" if dt.is_float else f"difference histogram ({dt.name} units)"
            out.append(f"    {what}: " + ", ".join(f"{k}: {v}" for k, v in self.histogram.items()))
        specials = [
            (self.nan_payload, "NaN payload changes (NaN on both sides, other bits)"),
            (self.nan_changed, "NaN appeared or disappeared"),
            (self.zero_sign, "sign-of-zero changes (+0.0 <-> -0.0)"),
        ]
        out += [f"    {label}: {n}" for n, label in specials if n]
        out.append("    worst elements:")
        out += [f"      {m.describe(dt)}" for m in self.worst]
        return out


@dataclass(frozen=True)
class TensorsDiff:
    """A whole tensor golden compared, tensor by tensor (sorted by name)."""

    name: str
    tensors: tuple[TensorDiff, ...]

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tensors)

    @property
    def moved(self) -> list[TensorDiff]:
        return [t for t in self.tensors if not t.ok]

    def summary(self) -> str:
        n = len(self.tensors)
        if self.ok:
            total = sum(t.numel for t in self.tensors)
            return f"{self.name}: unchanged ({n} tensors, {total} elements, all bits equal)"
        parts = [f"{t.tensor} ({t.problem or f'{t.moved} of {t.numel} elements moved'})" for t in self.moved]
        return f"{self.name}: {len(parts)} of {n} tensors differ: " + "; ".join(parts)

    def report(self) -> str:
        """Multi-line human report: the summary, then each differing tensor."""
        if self.ok:
            return self.summary()
        return "\n".join([self.summary()] + [ln for t in self.moved for ln in t.lines()])


def compare_tensor(tn: str, golden: StoredTensor, obtained: StoredTensor, worst: int = 5) -> TensorDiff:
    """Compare one tensor on bits (see the module docstring)."""
    base = dict(
        tensor=tn, golden=golden.describe(), obtained=obtained.describe(), numel=golden.numel, dtype=golden.dtype
    )
    if golden.dtype != obtained.dtype:
        return TensorDiff(**base, problem=f"dtype {golden.dtype.name} -> {obtained.dtype.name}")
    if golden.shape != obtained.shape:
        return TensorDiff(**base, problem=f"shape {list(golden.shape)} -> {list(obtained.shape)}")
    dt = golden.dtype
    idx = np.flatnonzero(golden.bits != obtained.bits)
    if not idx.size:
        return TensorDiff(**base)
    g, o = golden.bits[idx], obtained.bits[idx]
    dist = B.distance(g, o, dt)
    gn, on = B.is_nan(g, dt), B.is_nan(o, dt)
    nan = gn | on

    def moved(k: int) -> Moved:
        return Moved(golden.index(int(idx[k])), int(g[k]), int(o[k]), -1 if nan[k] else int(dist[k]))

    # Worst: NaN involvement first, then the largest distance; ties by index.
    order = np.lexsort((idx, np.iinfo(np.uint64).max - dist, ~nan))[:worst]
    return TensorDiff(
        **base,
        moved=int(idx.size),
        first=moved(0),
        histogram=B.histogram(dist, nan),
        worst=tuple(moved(int(k)) for k in order),
        nan_payload=int((gn & on).sum()),
        nan_changed=int((gn ^ on).sum()),
        zero_sign=int((B.is_zero(g, dt) & B.is_zero(o, dt)).sum()),
    )


def compare(
    name: str, golden: Mapping[str, StoredTensor], obtained: Mapping[str, StoredTensor], worst: int = 5
) -> TensorsDiff:
    """Compare every tensor of a golden; a tensor on one side only is a difference."""
    out = []
    for tn in sorted(set(golden) | set(obtained)):
        if tn not in obtained:
            out.append(
                TensorDiff(tn, golden[tn].describe(), None, problem="only in the golden (not in the obtained tensors)")
            )
        elif tn not in golden:
            out.append(
                TensorDiff(
                    tn,
                    None,
                    obtained[tn].describe(),
                    problem=f"new tensor {obtained[tn].describe()}, not in the golden",
                )
            )
        else:
            out.append(compare_tensor(tn, golden[tn], obtained[tn], worst))
    return TensorsDiff(name, tuple(out))
