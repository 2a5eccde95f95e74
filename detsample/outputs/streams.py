"""stdout and stderr that never end a command, and stdout kept for data.

:func:`guarded_streams` (the ``detsample`` command runs every sub-command inside it)
replaces ``sys.stdout`` and ``sys.stderr`` by :class:`QuietStream` wrappers:

* a stream that is closed (``>&-``: ``sys.stdout`` is None) or whose reader went away
  (``| head``, ``| true``: ``BrokenPipeError``) swallows what is written from then on, so
  the command ends with its usual exit code, never a traceback and never 1 (which means
  "a gate failed");
* text the stream's encoding cannot spell (a non-UTF-8 file name, decoded by Python with
  surrogate escapes, on a strict UTF-8 stdout) is written with backslash escapes;
* with ``data=True`` (``--json -``), ``sys.stdout`` is stderr for the whole command (and
  so is file descriptor 1, where stdout is one: worker processes and C code inherit it):
  a user's factory that prints "loading weights" cannot corrupt the JSON, which the
  command writes to :func:`data_stdout`, the real stdout.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO


class QuietStream:
    """``inner`` (a text stream, or None for a closed one) that never raises on write:
    module docstring. ``broken`` tells whether writes are being dropped."""

    def __init__(self, inner: TextIO | None) -> None:
        self.inner = inner
        self.broken = inner is None or getattr(inner, "closed", False)

    def write(self, text: str) -> int:
        if self.broken:
            return len(text)
        try:
            try:
                return self.inner.write(text)
            except UnicodeEncodeError:
                enc = getattr(self.inner, "encoding", None) or "utf-8"
                return self.inner.write(text.encode(enc, "backslashreplace").decode(enc))
        except (BrokenPipeError, ValueError, OSError):  # ValueError: closed under us
            self.broken = True
            return len(text)

    def flush(self) -> None:
        if self.broken:
            return
        try:
            self.inner.flush()
        except (BrokenPipeError, ValueError, OSError):
            self.broken = True

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def isatty(self) -> bool:
        return not self.broken and bool(getattr(self.inner, "isatty", lambda: False)())

    def __getattr__(self, attr: str) -> Any:  # encoding, fileno, buffer, ...
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)


_DATA: list[QuietStream] = []


def data_stdout() -> QuietStream | TextIO:
    """Where machine-readable output goes: the real stdout inside :func:`guarded_streams`
    (also when ``sys.stdout`` was pointed at stderr), else ``sys.stdout``."""
    return _DATA[-1] if _DATA else sys.stdout


def stdout_is_data(args: object) -> bool:
    """Whether a command's options put data on stdout (``--json -``)."""
    return getattr(args, "json", None) == "-"


def _silence_fd(stream: QuietStream) -> None:
    """After a broken pipe: point the stream's descriptor at /dev/null, so Python's final
    flush at exit does not print 'Exception ignored ... BrokenPipeError'."""
    try:
        fd = stream.inner.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except (AttributeError, ValueError, OSError):
        pass


def _fileno(stream: Any) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, ValueError, OSError):
        return None


def _data_stream(stdout: Any, stderr: Any) -> tuple[QuietStream, Callable[[], None]]:
    """The real stdout for data, and how to undo: where both streams are descriptors, fd 1
    is pointed at stderr too (a worker process or C code of a user's model writing to
    fd 1 lands on stderr) and the data goes to a duplicate of the old fd 1."""
    out_fd, err_fd = _fileno(stdout), _fileno(stderr)
    if out_fd is None or err_fd is None or out_fd == err_fd:
        return QuietStream(stdout), lambda: None
    with contextlib.suppress(OSError, ValueError):
        stdout.flush()
    saved = os.dup(out_fd)
    os.dup2(err_fd, out_fd)
    data = QuietStream(io.TextIOWrapper(os.fdopen(saved, "wb"), encoding="utf-8", errors="backslashreplace"))

    def restore() -> None:
        data.flush()
        os.dup2(saved, out_fd)
        with contextlib.suppress(OSError, ValueError):
            data.inner.close()

    return data, restore


@contextlib.contextmanager
def guarded_streams(data: bool = False) -> Iterator[None]:
    """``sys.stdout`` / ``sys.stderr`` as :class:`QuietStream` inside the block (with
    ``data``: ``sys.stdout`` is stderr, and so is fd 1 where stdout is a descriptor; the
    real stdout is :func:`data_stdout`); both are restored after it."""
    saved = sys.stdout, sys.stderr
    err = QuietStream(sys.stderr)
    out, restore = _data_stream(*saved) if data else (QuietStream(sys.stdout), lambda: None)
    sys.stdout, sys.stderr = (err if data else out), err
    _DATA.append(out)
    try:
        yield
    finally:
        _DATA.pop()
        out.flush()
        err.flush()
        if out.broken:
            _silence_fd(out)
        restore()
        sys.stdout, sys.stderr = saved
        if err.broken and err.inner is not None:
            _silence_fd(err)
