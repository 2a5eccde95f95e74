"""Input files: regular files only, read with a bound.

A path given as input is checked before it is opened (:func:`file_problem`): it must exist
and be a regular file once symlinks are followed. A FIFO (``mkfifo``), a character or
block device (``/dev/zero``, ``/dev/stdin`` on a terminal), a socket or a directory is
refused with the kind named: opening a FIFO blocks until a writer comes, a device never
ends. Reads are bounded: :func:`read_bounded` refuses a file over its limit before reading
it, :func:`read_line` a line over its limit.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from detsample.errors import DetsampleError


class InputError(DetsampleError, ValueError):
    """An input the commands refuse: a special file, a file or line over its stated size
    limit, JSON nested too deeply, an out-of-range option (file or option, value named)."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is not a readable regular file (symlinks followed), or None."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.fspath(path) == "-":  # the shell convention, where a command does not take it
            return "standard input ('-') is not read here; save the input to a file and give its path"
        return "no such file"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    return f"is {file_kind(path, mode)}; inputs must be regular files"


def file_kind(path: str | os.PathLike[str], mode: int | None = None) -> str:
    """What ``path`` is, in words: "a regular file", "a directory", "a FIFO (named pipe)",
    "a character device (a symlink to /dev/zero)", ...; "missing" when it does not exist."""
    if mode is None:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return "missing"
    kind = (
        "a regular file" if stat.S_ISREG(mode) else next((k for test, k in _KINDS if test(mode)), "not a regular file")
    )
    via = f" (a symlink to {os.path.realpath(path)})" if os.path.islink(path) else ""
    return kind + via


def input_file(path: str | os.PathLike[str]) -> str:
    """``path`` as a string when it is a readable regular file, else :class:`InputError`
    naming it and why."""
    problem = file_problem(path)
    if problem:
        raise InputError(f"{os.fspath(path)}: {problem}")
    return os.fspath(path)


def _limit_words(limit: int) -> str:
    return f"{limit:,} bytes" if limit < 1 << 20 else f"{limit / (1 << 20):,.0f} MiB"


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them: a larger file (or
    one that grows while read) is an :class:`InputError` stating the limit."""
    input_file(path)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{os.fspath(path)}: larger than the {_limit_words(limit)} limit of this kind of file")
    return data


def read_line(f: BinaryIO, limit: int, where: str) -> bytes:
    """The next line of ``f`` (b"" at the end), at most ``limit`` bytes: a longer line is
    an :class:`InputError` naming ``where`` (the file and line number) and the limit."""
    line = f.readline(limit + 1)
    if len(line) > limit:
        raise InputError(f"{where}: a line longer than the {_limit_words(limit)} limit")
    return line
