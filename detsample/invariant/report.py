"""What the mode decided on this machine: one row per (op, shape class, layout, dtype, threads).

:func:`kernel_rows` turns the plan registry (:mod:`detsample.invariant.state`) into plain
rows for reports (``detsample probe model --batch-invariant`` prints them and puts them
in its JSON under ``"kernels"``): which kernel each key took, what its invariance rests
on (``"verified on this machine"`` or ``"detsample's arithmetic"``) and why.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from detsample.invariant.state import Plan, plans


def _describe(key: Hashable) -> tuple[str, str, int]:
    """(op, shape class, threads) of a plan key."""
    kind = key[0]
    if kind == "matmul":
        _, op, k, n, lay, dtype, threads = key
        return op, f"K={k} N={n} {lay} {str(dtype).removeprefix('torch.')}", _threads(threads)
    if kind == "big":
        _, k, n, lay, dtype, threads = key
        return "mm", f"K={k} N={n} {lay} {str(dtype).removeprefix('torch.')} (>= 128 rows)", threads
    if kind == "sum":
        _, n, dtype, threads = key
        return "sum", f"row of {n} {str(dtype).removeprefix('torch.')}", _threads(threads)
    if kind == "pointwise":
        _, name, dtype, args, kwargs, threads = key
        extra = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs)])
        return name, str(dtype).removeprefix("torch.") + (f" ({extra})" if extra else ""), _threads(threads)
    if kind == "scan":
        return "scan", f"{key[1]} recurrence, float32 state", -1
    return str(kind), repr(key[1:]), -1


def _threads(t: Any) -> int:
    """A plan's thread count; -1 for a portable kernel (any thread count)."""
    return t if isinstance(t, int) else -1


def kernel_rows(keys: set | None = None) -> list[dict[str, Any]]:
    """``[{"op", "shape", "threads", "kernel", "rests_on", "reason"}]``, sorted: of every
    plan, or of the plans of ``keys`` (``plans().recording()`` collects a block's)."""
    rows = []
    for key, plan in plans().items():
        if keys is not None and key not in keys:
            continue
        op, shape, threads = _describe(key)
        rows.append(_row(op, shape, threads, plan))
    return sorted(rows, key=lambda r: (r["op"], r["shape"], r["threads"]))


def _row(op: str, shape: str, threads: int, plan: Plan) -> dict[str, Any]:
    return {
        "op": op,
        "shape": shape,
        "threads": threads,
        "kernel": plan.kernel,
        "rests_on": plan.rests_on,
        "reason": plan.reason,
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as an aligned text table (kernel and what it rests on; reasons of the
    kernels that fell back or were refused)."""
    if not rows:
        return "kernels: none used\n"
    head = ("op", "shape", "threads", "kernel", "rests on")
    body = [
        (r["op"], r["shape"], "any" if r["threads"] < 0 else str(r["threads"]), r["kernel"], r["rests_on"])
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    out = ["kernels the mode took on this machine:"]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *body]]
    odd = [r for r in rows if r["kernel"] == "refused" or "failed" in r["reason"]]
    for r in odd:
        out.append(f"  {r['op']} {r['shape']} ({r['threads']} threads): {r['reason']}")
    return "\n".join(out) + "\n"
