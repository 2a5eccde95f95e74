"""Probe results: per-check and per-op records, their JSON and their terminal tables.

JSON shapes (a contract; docs/probe.md):

* model: ``{"ok", "platform", "target", "checks": [{"name", "ok", "detail",
  "first_divergence": {"module", "op", "shapes", "max_ulp"} | null}]}``, plus, for a model
  under the batch-invariant mode, ``"kernels": [{"op", "shape", "threads", "kernel",
  "rests_on", "reason"}]`` (which kernel each shape took and why,
  :mod:`detsample.invariant.report`)
* ops: ``{"ok", "platform", "ops": [{"op", "dtype", "batch_invariant", "run_to_run",
  "threads", "first_differing_sizes", "max_ulp"}]}``

``platform`` is whatever the caller passes (the CLI passes the golden platform
fingerprint, docs/golden.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from detsample.probe.localize import Divergence
from detsample.probe.ops import OpResult


@dataclass(frozen=True)
class ProbeCheck:
    """One model check: ``name`` (``prefill_decode``, ...), ``ok`` (every compared bit
    equal), ``detail`` (what was compared and how it differed) and, for a failed check,
    ``first_divergence`` (None when it passed or could not be localised)."""

    name: str
    ok: bool
    detail: str
    first_divergence: Divergence | None = None

    def to_json(self) -> dict[str, Any]:
        fd = self.first_divergence
        return {
            "name": self.name,
            "ok": self.ok,
            "detail": self.detail,
            "first_divergence": fd.to_json() if fd is not None else None,
        }


@dataclass(frozen=True)
class ModelReport:
    """Every check of one model (``target``, the spec or name probed)."""

    target: str
    platform: str
    checks: tuple[ProbeCheck, ...]
    kernels: tuple[dict[str, Any], ...] = ()

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        doc = {
            "ok": self.ok,
            "platform": self.platform,
            "target": self.target,
            "checks": [c.to_json() for c in self.checks],
        }
        if self.kernels:
            doc["kernels"] = [dict(k) for k in self.kernels]
        return doc

    def table(self) -> str:
        lines = [f"detsample probe model {self.target}  [{self.platform}]", ""]
        width = max(len(c.name) for c in self.checks) if self.checks else 5
        for c in self.checks:
            lines.append(f"{c.name:<{width}}  {'ok  ' if c.ok else 'FAIL'}  {c.detail}")
            if c.first_divergence is not None:
                lines.append(f"{'':<{width}}        {c.first_divergence.describe()}")
        if self.kernels:
            from detsample.invariant.report import table

            lines += ["", table(list(self.kernels)).rstrip("\n")]
        lines += [
            "",
            "ok: every check holds bitwise"
            if self.ok
            else f"FAILED: {', '.join(c.name for c in self.checks if not c.ok)}",
        ]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class OpsReport:
    """Every (op, dtype) result of :func:`detsample.probe.ops.probe_ops`."""

    platform: str
    ops: tuple[OpResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.ops)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "platform": self.platform, "ops": [r.to_json() for r in self.ops]}

    def table(self) -> str:
        rows = [
            ("op", "dtype", "batch inv.", "run to run", "threads", "first differing sizes", "max |diff|", "max ulp")
        ]
        for r in self.ops:
            rows.append(
                (
                    r.op,
                    r.dtype,
                    _yes(r.batch_invariant),
                    _yes(r.run_to_run),
                    "-" if r.threads is None else _yes(r.threads),
                    "-" if r.first_differing_sizes is None else " vs ".join(str(s) for s in r.first_differing_sizes),
                    f"{r.max_abs:.3g}",
                    str(r.max_ulp),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        out = [f"detsample probe ops  [{self.platform}]", ""]
        out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        bad = [f"{r.op} ({r.dtype})" for r in self.ops if not r.ok]
        out += ["", f"variant: {', '.join(bad)}" if bad else "ok: every op holds bitwise"]
        return "\n".join(out) + "\n"


def _yes(v: bool) -> str:
    return "yes" if v else "NO"


def dumps(report: ModelReport | OpsReport) -> str:
    """The report's JSON text (strict JSON: no NaN or Infinity)."""
    return json.dumps(report.to_json(), indent=1, allow_nan=False) + "\n"


def markdown_ops(results: Sequence[OpResult]) -> str:
    """The op results as a markdown table (docs/probe.md keeps one)."""
    head = "| op | dtype | batch-invariant | run to run | threads | first differing sizes | max \\|diff\\| | max ulp |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in results:
        sizes = "-" if r.first_differing_sizes is None else " vs ".join(map(str, r.first_differing_sizes))
        thr = "-" if r.threads is None else _yes(r.threads)
        lines.append(
            f"| `{r.op}` | {r.dtype} | {_yes(r.batch_invariant)} | {_yes(r.run_to_run)} "
            f"| {thr} | {sizes} | {r.max_abs:.3g} | {r.max_ulp} |"
        )
    return "\n".join(lines) + "\n"
