"""Output paths checked before a command starts its work (not a sub-command: the CLI
skips modules whose name starts with ``_``).

A command that runs for minutes and then cannot write its ``--json`` or ``--report``
wastes the run and reports an I/O traceback where a usage error belongs. Each command
calls :func:`output_problems` first and exits 2 with the message; nothing is created
here (the command creates the missing folders when it writes).
"""

from __future__ import annotations

import os
from pathlib import Path

from detsample.outputs import OutputError, data_stdout, output_input_clash, write_file


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


def report_clash(args: object, inputs: list[tuple[str, str]], report_files: tuple[str, ...]) -> str | None:
    """The usage error of ``--json`` or a file ``--report DIR`` writes (``report_files``)
    being one of ``inputs`` (``(path, option)`` pairs), or None."""
    outputs = [(getattr(args, "json", None), "--json")]
    report = getattr(args, "report", None)
    if report:
        outputs += [(os.path.join(report, f), f"--report {report}:") for f in report_files]
    return output_input_clash(outputs, inputs)


def report_failure(exc: OSError, folder: str) -> str:
    """The one line of a ``--report`` folder that could not be written: the writer's own
    message (it names the file) or the folder and the reason."""
    return str(exc) if isinstance(exc, OutputError) else f"cannot write --report {folder}: {exc.strerror or exc}"


def write_output(path: str | os.PathLike[str], text: str, flag: str) -> str | None:
    """Write ``text`` to ``path`` (``-``: the data stdout; a file: atomically, missing
    folders created, :func:`detsample.outputs.write_file`); the failure as one message
    naming ``flag``, the path and the reason (a full disk, ``/dev/full``), or None when
    written."""
    if str(path) == "-":
        out = data_stdout()
        out.write(text)
        out.flush()
        return None
    try:
        write_file(path, text, flag)
    except OutputError as exc:
        return str(exc)
    return None
