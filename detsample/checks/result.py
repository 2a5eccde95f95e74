"""The result type of every ``detsample check`` check.

A check is any callable returning :class:`CheckResult` (or, from other packages, an
object with ``ok`` and ``detail`` attributes, a ``(ok, detail)`` tuple, or a dict with
those keys: :func:`as_result` normalises them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CheckResult:
    """``ok`` is True only when the property held; ``skipped`` marks a check that could
    not run (never counted as a pass unless the caller explicitly allows it)."""

    name: str
    ok: bool
    detail: str
    skipped: bool = False

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "ok": bool(self.ok), "detail": self.detail}
        if self.skipped:
            d["skipped"] = True
        return d


def as_result(name: str, value: Any) -> CheckResult:
    """Normalise a check's return value (see the module docstring) to a CheckResult."""
    if isinstance(value, CheckResult):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return CheckResult(name, bool(value[0]), str(value[1]))
    if isinstance(value, dict) and "ok" in value:
        return CheckResult(
            str(value.get("name", name)),
            bool(value["ok"]),
            str(value.get("detail", "")),
            bool(value.get("skipped", False)),
        )
    if hasattr(value, "ok"):
        return CheckResult(
            str(getattr(value, "name", name)),
            bool(value.ok),
            str(getattr(value, "detail", "")),
            bool(getattr(value, "skipped", False)),
        )
    if isinstance(value, bool):
        return CheckResult(name, value, "passed" if value else "failed")
    raise TypeError(f"check {name!r} returned {type(value).__name__}, expected a CheckResult")


__all__ = ["CheckResult", "as_result"]
