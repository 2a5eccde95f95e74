"""Scripted arrivals for the continuous-batching engine (frozen, validated)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from detsample.errors import InvalidSamplingParams
from detsample.params import Request


@dataclass(frozen=True)
class Arrival:
    """``request`` joins the batch at engine step ``step`` (>= 0)."""

    step: int
    request: Request

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise InvalidSamplingParams(f"arrival step must be an integer >= 0, got {self.step!r}")
        if not isinstance(self.request, Request):
            raise InvalidSamplingParams(f"arrival request must be a Request, got {type(self.request).__name__}")
        if not self.request.prompt_ids and not self.request.output_ids:
            raise InvalidSamplingParams(f"request {self.request.rid!r}: prompt_ids must not be empty, got []")


@dataclass(frozen=True)
class Schedule:
    """Arrivals in script order. Same-step arrivals join the batch in this order.

    >>> Schedule.of([(0, Request("a", prompt_ids=[1, 2])), (3, Request("b", prompt_ids=[5]))])
    """

    arrivals: tuple[Arrival, ...]

    def __post_init__(self) -> None:
        arr = tuple(self.arrivals)
        for a in arr:
            if not isinstance(a, Arrival):
                raise InvalidSamplingParams(f"arrivals must be Arrival objects, got {type(a).__name__}")
        seen: set[str] = set()
        for a in arr:
            if a.request.rid in seen:
                raise InvalidSamplingParams(f"request ids must be unique, got {a.request.rid!r} twice")
            seen.add(a.request.rid)
        object.__setattr__(self, "arrivals", arr)

    @classmethod
    def of(cls, items: Iterable[tuple[int, Request]]) -> Schedule:
        return cls(tuple(Arrival(s, r) for s, r in items))

    def ordered(self) -> list[Arrival]:
        """Arrivals by step; script order within a step (a stable sort)."""
        return sorted(self.arrivals, key=lambda a: a.step)
