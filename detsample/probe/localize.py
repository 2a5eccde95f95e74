"""Localisation: the first module and the first aten op where two forwards part ways.

Two forwards that should give one token the same bits (decode vs prefill, alone vs in a
batch, ...) are each run once under a :class:`Recorder`. It follows one PROBED token
through the forward: its ``row`` in the batch and its ``col`` in the padded new-token
axis of a forward over ``batch`` rows of ``width`` new tokens. For every tensor an op
produces, the token's slice is taken by layout:

* ``(batch, width, ...)``        -> ``t[row, col]``          (hidden states, projections)
* ``(batch, heads, width, ...)`` -> ``t[row, :, col]``       (per-head q/k/v, attention out)
* ``(batch * width, ...)``       -> ``t[row * width + col]`` (the 2-D matmul inside linear)

Tensors of any other layout (masks, caches, weights) are not followed. Each recorded op
is keyed by ``(module, op name, occurrence within that module)``: the innermost
``nn.Module`` running when it ran (forward pre-hooks and hooks keep the stack, in
execution order) and how many ops of that name the module had run before. Views and
in-place ops are skipped (they compute nothing new), and so are the ops that allocate
without writing (:data:`UNWRITTEN`: their contents are whatever memory held, filled later
in place -- MLA's key states are built so). :func:`first_divergence` walks the
first forward's records in execution order and returns the first whose slice differs
bitwise from the second forward's record under the same key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from detsample.probe.compare import Diff, bits_equal, diff

#: ops whose output is uninitialised memory (never compared)
UNWRITTEN = frozenset(
    {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided"}
)


@dataclass(frozen=True)
class Side:
    """One forward to record: ``call()`` runs it (caches already prepared); the probed
    token is at ``(row, col)`` of a ``(batch, width)`` padded layout."""

    call: Callable[[], Any]
    row: int
    col: int
    batch: int
    width: int


@dataclass(frozen=True)
class Divergence:
    """Where two forwards first differ: ``module`` (dotted name), ``op`` (``aten::mm``;
    None when only module outputs could be compared), ``shapes`` of the op's tensor
    inputs in both forwards (``"[1,256]x[256,256] vs [40,256]x[256,256]"``), and the
    probed token's ``max_ulp`` / ``max_abs`` there."""

    module: str
    op: str | None
    shapes: str | None
    max_ulp: int
    max_abs: float

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "op": self.op, "shapes": self.shapes, "max_ulp": self.max_ulp}

    def describe(self) -> str:
        where = self.module + (f" -> {self.op}" if self.op else "")
        shapes = f" {self.shapes}" if self.shapes else ""
        return f"first divergence: {where}{shapes}, {self.max_ulp} ulp"


def select(t: torch.Tensor, side: Side) -> dict[str, torch.Tensor]:
    """The probed token's slice of ``t`` under each layout of the module docstring that
    ``t``'s shape admits, keyed by layout (``"bt"``, ``"bht"``, ``"flat"``). Several
    layouts match when sizes coincide (5 heads and a 5-token chunk); the comparison then
    uses the layouts both forwards admit, which the other forward's sizes disambiguate."""
    B, T, b, c = side.batch, side.width, side.row, side.col
    s = t.shape
    out: dict[str, torch.Tensor] = {}
    if t.dim() >= 2 and s[0] == B and s[1] == T:
        out["bt"] = t[b, c]
    if t.dim() >= 3 and s[0] == B and s[2] == T:
        out["bht"] = t[b, :, c]
    if t.dim() >= 1 and s[0] == B * T:
        out["flat"] = t[b * T + c]
    return out


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "values") and callable(out.values):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        for o in out:
            if isinstance(o, torch.Tensor):
                return o
    return None


def _shapes(args: Any) -> list[list[int]]:
    out: list[list[int]] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(list(a.shape))
        elif isinstance(a, (tuple, list)):
            out.extend(_shapes(a))
    return out


@dataclass
class _Record:
    key: tuple[str, str, int]
    values: dict[str, torch.Tensor]  # layout -> the probed token's slice (cloned)
    shapes: list[list[int]]


def _clone(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in values.items()}


class Recorder(TorchDispatchMode):
    """Records the probed token's slice of every op output (and of every module output of
    ``module``, when given) while active. ``root`` names ops run outside any module."""

    def __init__(self, side: Side, module: torch.nn.Module | None = None, root: str = "model") -> None:
        super().__init__()
        self.side, self.module, self.root = side, module, root
        self.stack: list[str] = []
        self.ops: list[_Record] = []
        self.modules: list[_Record] = []
        self._seen: dict[tuple[str, str], int] = {}
        self._handles: list[Any] = []
        self._busy = False

    # -- module stack (forward hooks) ------------------------------------------------
    def _pre(self, name: str) -> Callable[..., None]:
        def hook(mod: Any, args: Any) -> None:
            self.stack.append(name)

        return hook

    def _post(self, name: str) -> Callable[..., None]:
        def hook(mod: Any, args: Any, out: Any) -> None:
            if self.stack and self.stack[-1] == name:
                self.stack.pop()
            t = _first_tensor(out)
            v = select(t, self.side) if t is not None and t.is_floating_point() else {}
            if v:
                n = self._count(name, "<output>")
                self._busy = True  # the clone is the recorder's, not the model's op
                try:
                    self.modules.append(_Record((name, "<output>", n), _clone(v), []))
                finally:
                    self._busy = False

        return hook

    def _count(self, scope: str, op: str) -> int:
        n = self._seen.get((scope, op), 0)
        self._seen[(scope, op)] = n + 1
        return n

    def __enter__(self) -> Recorder:
        if self.module is not None:
            for name, mod in self.module.named_modules():
                label = name or self.root
                self._handles.append(mod.register_forward_pre_hook(self._pre(label)))
                self._handles.append(mod.register_forward_hook(self._post(label)))
        try:
            super().__enter__()
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._remove()

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # -- ops (dispatch mode) ---------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if self._busy or func.is_view or func._schema.is_mutable or func._schema.name in UNWRITTEN:
            return out
        t = _first_tensor(out)
        scope = self.stack[-1] if self.stack else self.root
        name = func._schema.name
        n = self._count(scope, name)
        if t is not None and t.is_floating_point():
            v = select(t, self.side)
            if v:
                self.ops.append(
                    _Record((scope, name, n), _clone(v), _shapes(list(args) + list((kwargs or {}).values())))
                )
        return out


def record(side: Side, module: torch.nn.Module | None, root: str) -> Recorder:
    """Run ``side.call()`` under a :class:`Recorder` and return it."""
    rec = Recorder(side, module, root)
    with torch.no_grad(), rec:
        side.call()
    return rec


def _fmt(shapes: list[list[int]]) -> str:
    return "x".join("[" + ",".join(str(d) for d in s) + "]" for s in shapes)


Align = Callable[[torch.Tensor, torch.Tensor], "torch.Tensor | None"]


def shard_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """:data:`Align` for a tensor-parallel rank 0 against TP=1: where ``x`` (rank 0's
    slice) is ``y``'s shape but for one dim that is a divisor of ``y``'s, the leading
    block of ``y`` along it (rank 0 holds the first heads / features / vocabulary rows);
    None when the shapes admit no such block."""
    if x.dim() != y.dim():
        return None
    dims = [d for d in range(x.dim()) if x.shape[d] != y.shape[d]]
    if len(dims) != 1 or x.shape[dims[0]] == 0 or y.shape[dims[0]] % x.shape[dims[0]]:
        return None
    return y.narrow(dims[0], 0, x.shape[dims[0]])


def _first(a: list[_Record], b: list[_Record], align: Align | None = None) -> tuple[_Record, _Record, Diff] | None:
    """The first record of ``a`` (execution order) whose slice differs from ``b``'s under
    the same key, compared in every layout both admit with equal shapes (``align``: maps
    ``b``'s slice onto ``a``'s shape where they differ, or None to skip it)."""
    other = {r.key: r for r in b}
    for r in a:
        o = other.get(r.key)
        if o is None:
            continue
        for layout in r.values.keys() & o.values.keys():
            x, y = r.values[layout], o.values[layout]
            if align is not None and x.shape != y.shape:
                y = align(x, y)
                if y is None:
                    continue
            if x.shape == y.shape and x.dtype == y.dtype and not bits_equal(x, y):
                return r, o, diff(x, y)
    return None


def to_data(rec: Recorder) -> dict[str, list[dict[str, Any]]]:
    """``rec``'s records as plain lists and dicts of tensors (to send from another
    process; :func:`from_data` reads them back)."""

    def one(r: _Record) -> dict[str, Any]:
        return {"key": list(r.key), "values": dict(r.values), "shapes": r.shapes}

    return {"ops": [one(r) for r in rec.ops], "modules": [one(r) for r in rec.modules]}


def from_data(data: dict[str, list[dict[str, Any]]]) -> tuple[list[_Record], list[_Record]]:
    def one(d: dict[str, Any]) -> _Record:
        return _Record(tuple(d["key"]), dict(d["values"]), [list(s) for s in d["shapes"]])

    return [one(d) for d in data["ops"]], [one(d) for d in data["modules"]]


def divergence(
    a: tuple[list[_Record], list[_Record]], b: tuple[list[_Record], list[_Record]], align: Align | None = None
) -> Divergence | None:
    """Where recorded forward ``a`` (ops, module outputs) first differs from ``b``: the
    first differing op, else the first differing module output, else None."""
    hit = _first(a[0], b[0], align)
    if hit is not None:
        x, y, d = hit
        return Divergence(x.key[0], x.key[1], f"{_fmt(x.shapes)} vs {_fmt(y.shapes)}", d.max_ulp, d.max_abs)
    hit = _first(a[1], b[1], align)
    if hit is not None:
        x, _, d = hit
        return Divergence(x.key[0], None, None, d.max_ulp, d.max_abs)
    return None


def first_divergence(a: Side, b: Side, module: torch.nn.Module | None = None, root: str = "model") -> Divergence | None:
    """Record both forwards and return where the probed token first differs, or None
    when no followed tensor differs (then the difference arises outside what the
    recorder can follow: say so, do not guess)."""
    ra, rb = record(a, module, root), record(b, module, root)
    return divergence((ra.ops, ra.modules), (rb.ops, rb.modules))
