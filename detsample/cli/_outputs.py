"""Output paths checked before a command starts its work (not a sub-command: the CLI
skips modules whose name starts with ``_``).

A command that runs for minutes and then cannot write its ``--json`` or ``--report``
wastes the run and reports an I/O traceback where a usage error belongs. Each command
calls :func:`output_problems` first and exits 2 with the message; nothing is created
here (the command creates the missing folders when it writes).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def output_problem(path: str | os.PathLike[str] | None, flag: str, kind: str = "file") -> str | None:
    """Why ``path`` cannot be written as a ``kind`` ("file" or "dir"), or None.

    None also for no path and for ``-`` (stdout). Checks: a file must not be an existing
    folder, a folder must not be an existing file; the nearest existing ancestor of what
    is to be created must be a folder this process can write."""
    if path is None or str(path) == "-":
        return None
    p = Path(path)
    if str(path) == "":
        return f"{flag}: the path is empty"
    if p.exists():
        if kind == "file" and p.is_dir():
            return f"cannot write {flag} {path}: it is a directory"
        if kind == "dir" and not p.is_dir():
            return f"cannot write {flag} {path}: it exists and is not a directory"
        target = p if kind == "dir" else p.parent
        if not os.access(target if str(target) else ".", os.W_OK):
            return f"cannot write {flag} {path}: {target} is not writable"
        if kind == "file" and not os.access(p, os.W_OK):
            return f"cannot write {flag} {path}: the file is not writable"
        return None
    anchor = _nearest_existing(p.parent if kind == "file" else p)
    if not anchor.is_dir():
        return f"cannot write {flag} {path}: {anchor} is not a directory"
    if not os.access(anchor, os.W_OK | os.X_OK):
        return f"cannot write {flag} {path}: {anchor} is not writable"
    return None


def output_problems(*specs: tuple[str | os.PathLike[str] | None, str, str]) -> list[str]:
    """:func:`output_problem` of each ``(path, flag, kind)``; the problems found."""
    return [m for m in (output_problem(*s) for s in specs) if m]


def write_output(path: str | os.PathLike[str], text: str, flag: str) -> str | None:
    """Write ``text`` to ``path`` (``-``: stdout; missing folders created); the failure as
    one message naming ``flag``, the path and the reason (a full disk, ``/dev/full``), or
    None when written."""
    try:
        if str(path) == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
            return None
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        return f"cannot write {flag} {path}: {exc.strerror or exc}"
    return None
