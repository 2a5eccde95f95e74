"""Files written whole or not at all, at exactly the path given.

:func:`write_file` writes to a temporary file in the destination's folder (the same file
system), flushes and fsyncs it, then renames it onto the destination with ``os.replace``
(atomic on POSIX): a reader sees the old file or the new one, never a part. Whatever
interrupts the write (``OSError`` such as ENOSPC or EFBIG, an exception of the producer,
``KeyboardInterrupt``) removes the temporary file and leaves the old file as it was.

A symlink is written through (its target is replaced, the link stays); an existing
special file (``/dev/null``, a FIFO) and a path under /dev or /proc (``/dev/stdout``, even
when the shell redirected it to a file) are written in place, having no bytes to lose. Missing folders are created.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from typing import BinaryIO

from detsample.errors import DetsampleError


class OutputError(DetsampleError, OSError):
    """An output that cannot be written, or that would overwrite an input (the option,
    the path and the reason named)."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _destination(path: str) -> str:
    """Where the bytes of ``path`` go: a symlink's target (the link stays a link)."""
    return os.path.realpath(path) if os.path.islink(path) else path


#: paths that name a stream of this process or a device, whatever they resolve to
#: (``/dev/stdout`` redirected to a file is that file, shared with the shell)
_STREAM_DIRS = ("/dev/", "/proc/")


def _in_place(path: str) -> bool:
    """Whether ``path`` is written in place: an existing special file (``/dev/null``, a
    FIFO), or a path under /dev or /proc (``/dev/stdout``, ``/proc/self/fd/1``)."""
    if os.path.abspath(path).startswith(_STREAM_DIRS):
        return os.path.exists(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _put(fh: BinaryIO, data: str | bytes | Callable[[BinaryIO], object]) -> None:
    if callable(data):
        data(fh)
    else:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)


def _stage(folder: str, name: str, data, mode: int) -> str:
    """``data`` in a fresh temporary file of ``folder`` (fsynced, ``mode``); its path."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            _put(fh, data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def stage_file(path: str | os.PathLike[str], data) -> str:
    """The first half of :func:`write_file`: ``data`` staged beside ``path`` (folders
    created, the old file's mode kept); the temporary path, for :func:`commit_file`.
    ``OSError`` as raised (the caller names it)."""
    dest = _destination(os.fspath(path))
    folder = os.path.dirname(dest) or "."
    os.makedirs(folder, exist_ok=True)
    try:
        mode = stat.S_IMODE(os.stat(dest).st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    return _stage(folder, os.path.basename(dest), data, mode)


def commit_file(tmp: str, path: str | os.PathLike[str]) -> None:
    """Move a :func:`stage_file` result onto ``path`` (through a symlink); the temporary
    file is gone afterwards whatever happens."""
    try:
        os.replace(tmp, _destination(os.fspath(path)))
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def write_file(path: str | os.PathLike[str], data, flag: str = "output") -> None:
    """Write ``data`` (str as UTF-8, bytes, or a function writing a binary file object:
    numpy's ``savez``, pyarrow's ``write_table``, matplotlib's ``savefig``) to
    exactly ``path``, atomically (module docstring). A failure is an :class:`OutputError`
    ``cannot write FLAG PATH: REASON``; the old file is untouched and no partial one is
    left."""
    p = os.fspath(path)
    try:
        if _in_place(p):  # /dev/null, /dev/stdout, a FIFO: nothing there to lose
            with open(p, "ab") as fh:  # appended: /dev/stdout > file keeps what came before
                _put(fh, data)
            return
        commit_file(stage_file(p, data), p)
    except OSError as exc:
        if isinstance(exc, OutputError):
            raise
        raise OutputError(f"cannot write {flag} {_shown(p)}: {exc.strerror or exc}") from exc


def append_file(path: str | os.PathLike[str], data: str | bytes, flag: str = "output") -> None:
    """Append ``data`` to ``path`` (created if missing) whole or not at all: a failed or
    interrupted write is cut back to the old size, so a log never ends in half a row. A
    failure is an :class:`OutputError` naming ``flag``, the path and the reason."""
    p = os.fspath(path)
    try:
        with open(p, "ab") as fh:
            size = fh.seek(0, os.SEEK_END)
            try:
                _put(fh, data)
                fh.flush()
            except BaseException:
                fh.truncate(size)
                raise
    except OSError as exc:
        raise OutputError(f"cannot write {flag} {_shown(p)}: {exc.strerror or exc}") from exc


def _shown(path: str) -> str:
    return path.encode("utf-8", "backslashreplace").decode("utf-8")


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` are one file: the same path once symlinks are resolved, or
    the same inode (a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


Named = tuple[str | os.PathLike[str] | None, str]


def output_input_clash(outputs: Iterable[Named], inputs: Iterable[Named]) -> str | None:
    """The usage error of an output that is one of the inputs (:func:`same_file`), naming
    both options and the path; None when none is. ``(path, option)`` pairs; a path None
    or ``-`` (a stream) is skipped. For a report folder pass each file it writes."""
    ins = [(os.fspath(p), f) for p, f in inputs if p is not None and os.fspath(p) != "-"]
    for out, oflag in outputs:
        if out is None or os.fspath(out) == "-":
            continue
        for inp, iflag in ins:
            if same_file(out, inp):
                return (
                    f"{oflag} {_shown(os.fspath(out))} is the input {iflag} "
                    f"{_shown(inp)}: writing it would destroy the input; give another path"
                )
    return None


def output_inside_problem(
    path: str | os.PathLike[str] | None, flag: str, folder: str | os.PathLike[str], folder_flag: str
) -> str | None:
    """The usage error of an output ``path`` inside an input folder (``check --json``
    among the goldens it compares against), naming both options and the path; or None."""
    if path is None or os.fspath(path) == "-":
        return None
    out, root = os.path.realpath(path), os.path.realpath(folder)
    if os.path.commonpath([out, root]) != root:
        return None
    return (
        f"{flag} {_shown(os.fspath(path))} is inside the input {folder_flag} "
        f"{_shown(os.fspath(folder))}: writing it could replace an input; give another path"
    )
