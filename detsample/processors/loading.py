"""Logits processors named as vLLM and SGLang name them: by class or by entry point.

``Sampler(processors=...)`` takes, beside :class:`LogitsProcessor` instances:

* a class (a :class:`LogitsProcessor` subclass), constructed with no arguments;
* a fully qualified class name, ``"package.module.ClassName"`` or
  ``"package.module:ClassName"`` (imported, then constructed as above);
* an entry-point name of the group :data:`ENTRY_POINT_GROUP` (``"detsample.logits_processors"``
  in a package's ``pyproject.toml``: ``[project.entry-points."detsample.logits_processors"]
  name = "package.module:ClassName"``); :func:`installed_processors` loads every one of
  them (what vLLM does with its own group at start-up).

Every failure -- no such module, class, or entry point; not a ``LogitsProcessor``; a
constructor that needs arguments or raises -- is one :class:`InvalidSamplingParams`
naming the spec.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Sequence
from typing import Any

from detsample.errors import InvalidSamplingParams
from detsample.processors.base import LogitsProcessor

#: the entry-point group processors are registered in
ENTRY_POINT_GROUP = "detsample.logits_processors"


def load_processor(spec: Any) -> LogitsProcessor:
    """The processor ``spec`` names (see the module docstring); an instance is returned
    as it is."""
    if isinstance(spec, LogitsProcessor):
        return spec
    if isinstance(spec, type):
        return _construct(spec, spec.__qualname__)
    if not isinstance(spec, str) or not spec:
        raise InvalidSamplingParams(
            f"processors: expected a LogitsProcessor, a class, a class "
            f"name or an entry-point name, got {type(spec).__name__}"
        )
    if ":" in spec or "." in spec:
        return _construct(_import_class(spec), spec)
    return _construct(_load(_entry_point(spec)), f"entry point {spec!r}")


def load_processors(specs: Sequence[Any]) -> tuple[LogitsProcessor, ...]:
    """:func:`load_processor` of each item, in order."""
    if isinstance(specs, (str, type, LogitsProcessor)):
        specs = (specs,)
    return tuple(load_processor(s) for s in specs)


def installed_processors() -> tuple[LogitsProcessor, ...]:
    """Every processor registered under :data:`ENTRY_POINT_GROUP`, by entry-point name."""
    eps = sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    return tuple(_construct(_load(ep), f"entry point {ep.name!r}") for ep in eps)


def _import_class(spec: str) -> type:
    mod_name, sep, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not mod_name or not attr:
        raise InvalidSamplingParams(
            f"processor {spec!r}: expected package.module.ClassName or package.module:ClassName"
        )
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise InvalidSamplingParams(f"processor {spec!r}: cannot import {mod_name!r}: {exc}") from None
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InvalidSamplingParams(f"processor {spec!r}: module {mod_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def _entry_point(name: str):
    eps = [e for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if e.name == name]
    if not eps:
        raise InvalidSamplingParams(
            f"processor {name!r}: no entry point of that name in the "
            f"group {ENTRY_POINT_GROUP!r} (and not a class name: "
            "give package.module.ClassName)"
        )
    return eps[0]


def _load(ep) -> Any:
    try:
        return ep.load()
    except Exception as exc:  # noqa: BLE001 -- a broken plugin is named, whatever it raised
        raise InvalidSamplingParams(
            f"processor entry point {ep.name!r} ({ep.value}): {type(exc).__name__}: {exc}"
        ) from None


def _construct(cls: Any, what: str) -> LogitsProcessor:
    if not (isinstance(cls, type) and issubclass(cls, LogitsProcessor)):
        raise InvalidSamplingParams(
            f"processor {what}: {cls!r} is not a subclass of detsample.processors.LogitsProcessor"
        )
    try:
        return cls()
    except Exception as exc:  # noqa: BLE001 -- named once, whatever the constructor raised
        raise InvalidSamplingParams(
            f"processor {what}: {cls.__qualname__}() raised {type(exc).__name__}: {exc}"
        ) from None
