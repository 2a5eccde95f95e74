"""JSON text parsed with its nesting bounded.

Python's JSON parser recurses once per level: ``[[[[...`` 100,000 levels deep raises a
``RecursionError`` from inside the parser. :func:`loads` turns that into a ``ValueError``
(a :class:`json.JSONDecodeError` subclass is not possible: there is no position), the
kind of error every reader already names with its file and line.
"""

from __future__ import annotations

import json
import sys

#: the message of a structure nested beyond the parser's limit
JSON_DEPTH_WHY = "nested too deeply (the JSON parser's limit is about {} levels)"


class JsonTooDeep(ValueError):
    """JSON nested deeper than the parser recurses (the limit is in the message)."""


def depth_message() -> str:
    return JSON_DEPTH_WHY.format(sys.getrecursionlimit())


def loads(text: str | bytes) -> object:
    """``json.loads(text)``; a structure nested beyond the parser's recursion limit is a
    :class:`JsonTooDeep` (a ``ValueError``) whose message states the limit. Invalid JSON
    is :class:`json.JSONDecodeError`, as from :mod:`json`."""
    try:
        return json.loads(text)
    except RecursionError:
        raise JsonTooDeep(depth_message()) from None
