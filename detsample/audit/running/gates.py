"""The audit's gates: a gate decides on what was audited, never on what was excluded.

:func:`check_gates` (a file audit's report) and :func:`detsample.audit.reports.log.check_log_gates`
(the latest step of an audit log) share these rules:

* a report that audited **no token** fails, gate or no gate, and the failure says why
  (every sequence excluded and the first reason; no sequence read; every token masked);
* under any gate, **excluded sequences** fail it unless the user allows them with
  ``max_excluded``: an integer N (at most N sequences) or a float fraction F in [0, 1]
  (at most F of the sequences read), default 0 (:class:`ExclusionLimit`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from detsample.inputs.numbers import parse_float

_INT = re.compile(r"^[0-9]+$")


@dataclass(frozen=True)
class ExclusionLimit:
    """How many sequences a gated audit may exclude: ``count`` (an int >= 0) or
    ``fraction`` (of the sequences read, in [0, 1]); exactly one is set."""

    count: int | None = 0
    fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.count is None) == (self.fraction is None):
            raise ValueError("max_excluded: give a count or a fraction, not both")
        if self.count is not None and (
            isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0
        ):
            raise ValueError(f"max_excluded must be an integer >= 0 or a fraction in [0, 1], got {self.count!r}")
        if self.fraction is not None and not (isinstance(self.fraction, float) and 0.0 <= self.fraction <= 1.0):
            raise ValueError(f"max_excluded must be an integer >= 0 or a fraction in [0, 1], got {self.fraction!r}")

    @classmethod
    def of(cls, value: ExclusionLimit | int | float | str | None) -> ExclusionLimit:
        """A limit from the API's or the CLI's spelling: None -> 0; an int -> a count; a
        float -> a fraction; a string: digits only -> a count ("3"), else a fraction
        ("0.05", "1.0"). Anything else is a ValueError naming the value."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            text = value.strip()
            if _INT.match(text):
                return cls(int(text))
            try:
                f = parse_float(text)
            except ValueError:
                f = math.nan
            if not 0.0 <= f <= 1.0:
                raise ValueError(
                    f"max_excluded must be an integer N >= 0 or a fraction in [0, 1] (e.g. 3 or 0.05), got {value!r}"
                )
            return cls(None, f)
        if isinstance(value, bool):
            raise ValueError(f"max_excluded must be an integer or a fraction, got {value!r}")
        if isinstance(value, int):
            return cls(value)
        if isinstance(value, float):
            return cls(None, value)
        raise ValueError(f"max_excluded must be an integer or a fraction, got {value!r}")

    def allows(self, excluded: int, seen: int) -> bool:
        if self.count is not None:
            return excluded <= self.count
        return excluded <= self.fraction * seen  # type: ignore[operator]

    def describe(self, seen: int) -> str:
        """What the limit allows of ``seen`` sequences, for messages."""
        if self.count is not None:
            return f"{self.count} allowed"
        return f"{self.fraction!r} of them ({self.fraction * seen:g}) allowed"


def exclusion_failure(
    excluded: int, seen: int, limit: ExclusionLimit, kinds: Mapping[str, int] | None = None
) -> str | None:
    """The failure of a gated audit that excluded more sequences than ``limit`` allows."""
    if limit.allows(excluded, seen):
        return None
    why = "" if not kinds else " (" + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())) + ")"
    allowed = limit.describe(seen)
    return (
        f"excluded_sequences = {excluded} of {seen} > {allowed}{why}: a gate decides on "
        f"audited sequences only; allow exclusions with --max-excluded N or FRACTION"
    )


def no_tokens_failure(report: Mapping) -> str | None:
    """Why a report audited no token (None when it audited some, or does not say)."""
    if report.get("tokens", None) != 0:
        return None
    seen = int(report.get("sequences_seen", 0) or 0)
    excluded = int(report.get("excluded_sequences", 0) or 0)
    if seen == 0:
        return "tokens = 0: no tokens audited: the input holds no sequence"
    if excluded == seen:
        kinds = report.get("excluded_by_kind") or {}
        why = ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items()))
        issues = report.get("issues") or []
        first = ""
        if issues:
            it = issues[0]
            loc = f"line {it['line']}" if "line" in it else f"row {it.get('row')}"
            first = f"; first: {it['source']}:{loc}: {it['field']}: {it['message']}"
        return f"tokens = 0: no tokens audited: all {seen} sequences were excluded ({why}){first}"
    return f"tokens = 0: no tokens audited: the {seen - excluded} valid sequences have no token with mask 1" + (
        f" ({excluded} more were excluded)" if excluded else ""
    )


def check_gates(
    report: Mapping,
    max_abs_diff: float | None = None,
    min_exact_match: float | None = None,
    max_excluded: ExclusionLimit | int | float | str | None = None,
) -> list[str]:
    """Failed gates of a report, each naming its metric; empty when every gate passes.

    A report that audited no token always fails (gates or not). With any gate given
    (``max_abs_diff``, ``min_exact_match`` or ``max_excluded``), more excluded sequences
    than ``max_excluded`` allows (default 0) fail too: a gate never passes on rows it
    did not check."""
    failures = []
    empty = no_tokens_failure(report)
    if empty:
        failures.append(empty)
    gated = max_abs_diff is not None or min_exact_match is not None or max_excluded is not None
    if gated:
        limit = ExclusionLimit.of(max_excluded)
        bad = exclusion_failure(
            int(report.get("excluded_sequences", 0) or 0),
            int(report.get("sequences_seen", 0) or 0),
            limit,
            report.get("excluded_by_kind"),
        )
        if bad:
            failures.append(bad)
    if max_abs_diff is not None:
        v = report["max_abs_diff"]
        if v is None:
            failures.append("max_abs_diff: no tokens audited")
        elif not v <= max_abs_diff:
            failures.append(f"max_abs_diff = {v!r} > {max_abs_diff!r}")
    if min_exact_match is not None:
        v = report["exact_match_fraction"]
        if v is None:
            failures.append("exact_match_fraction: no tokens audited")
        elif not v >= min_exact_match:
            failures.append(f"exact_match_fraction = {v!r} < {min_exact_match!r}")
    return failures
