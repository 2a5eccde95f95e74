"""stdout and stderr that never end a command, and stdout kept for data.

:func:`guarded_streams` (the ``detsample`` command runs every sub-command inside it)
replaces ``sys.stdout`` and ``sys.stderr`` by :class:`QuietStream` wrappers:

* a stream that is closed (``>&-``: ``sys.stdout`` is None) or whose reader went away
  (``| head``, ``| true``: ``BrokenPipeError``) swallows what is written from then on, so
  the command ends with its usual exit code, never a traceback and never 1 (which means
  "a gate failed");
* text the stream's encoding cannot spell (a non-UTF-8 file name, decoded by Python with
  surrogate escapes, on a strict UTF-8 stdout) is written with backslash escapes;
* with ``data=True`` (``--json -``), ``sys.stdout`` is stderr for the whole command: a
  user's factory that prints "loading weights" cannot corrupt the JSON, which the command
  writes to :func:`data_stdout`, the real stdout.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
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


@contextlib.contextmanager
def guarded_streams(data: bool = False) -> Iterator[None]:
    """``sys.stdout`` / ``sys.stderr`` as :class:`QuietStream` inside the block (with
    ``data``: ``sys.stdout`` is stderr, the real stdout is :func:`data_stdout`); both are
    restored after it."""
    saved = sys.stdout, sys.stderr
    out, err = QuietStream(sys.stdout), QuietStream(sys.stderr)
    sys.stdout, sys.stderr = (err if data else out), err
    _DATA.append(out)
    try:
        yield
    finally:
        _DATA.pop()
        out.flush()
        err.flush()
        sys.stdout, sys.stderr = saved
        for s in (out, err):
            if s.broken and s.inner is not None:
                _silence_fd(s)
