"""Numbers as options and fields spell them: ASCII digits only.

Python's ``float`` and ``int`` accept more than a number: digit separators (``1_2_3`` is
123, so ``--rollout-rs-threshold 1_2_3`` read as lower 1, upper 23), surrounding
whitespace and non-ASCII digits. :func:`parse_float` and :func:`parse_int` accept the
plain spellings (``1``, ``-0.5``, ``1e-3``, ``inf``, ``nan``) and raise ``ValueError``
naming the text for anything else; the value rules (ranges, finiteness) stay with the
field that uses the number.
"""

from __future__ import annotations

import re

_FLOAT = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf|infinity|nan)", re.ASCII | re.IGNORECASE)
_INT = re.compile(r"[+-]?\d+", re.ASCII)


def parse_float(text: str) -> float:
    """``text`` as a float when it is a plain decimal spelling (module docstring), else
    ``ValueError`` naming it."""
    if not isinstance(text, str) or not _FLOAT.fullmatch(text):
        raise ValueError(f"not a number: {text!r} (digits, '.', an exponent; no '_' or spaces)")
    return float(text)


def parse_int(text: str) -> int:
    """``text`` as an int when it is plain ASCII digits with an optional sign, else
    ``ValueError`` naming it."""
    if not isinstance(text, str) or not _INT.fullmatch(text):
        raise ValueError(f"not an integer: {text!r} (digits only; no '_' or spaces)")
    return int(text)
