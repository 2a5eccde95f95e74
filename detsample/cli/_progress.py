"""Progress while long work runs (``check``, ``golden update``, ``rollout``, ``audit
--rescore``, ``probe model``), on stderr.

On a terminal (outside ``CI``): a ``rich`` bar (or a spinner when the total is unknown).
Elsewhere (a pipe, a CI log, a file): plain lines, one every :data:`LINE_EVERY` seconds at
most and none before -- ``rollout: 12/32 sequences, 0.41/s, ETA 49 s`` -- and a last one
when the work ends, if any was written; work shorter than that writes nothing, so stdout,
``--json`` and the stderr of short runs are byte for byte what they were without progress.
:class:`Progress` is the battery's progress callback ``(done, total, label)``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

#: seconds between two progress lines off a terminal (and before the first)
LINE_EVERY = 30.0


def on_terminal(stream: TextIO) -> bool:
    """Whether progress may be drawn on ``stream``: a terminal, outside CI."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty()) and not os.environ.get("CI")


class Progress:
    """``(done, total, label)`` -> a rich bar on ``stream`` (default stderr), only on a
    terminal (:func:`on_terminal`); the bar ends when ``done == total`` or at
    :meth:`close`. ``description``: the bar's title."""

    def __init__(self, description: str = "", stream: TextIO | None = None, every: float = LINE_EVERY) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.description = description
        self.enabled = on_terminal(self.stream)
        self._bar = None
        self._task = None
        self._lines = _Lines(self.stream, description, every)

    def __call__(self, done: int, total: int | None, label: str = "") -> None:
        if not self.enabled:
            self._lines(done, total, label)
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            console = Console(file=self.stream, force_terminal=True)
            self._bar = Bar(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.description, total=total)
        text = f"{self.description} {label}".strip()
        self._bar.update(self._task, completed=done, total=total, description=text)
        if total is not None and done >= total:
            self.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the bar (its last state stays on the terminal), or write the last line."""
        self._lines.close()
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.stop()


class _Lines:
    """Plain progress lines (off a terminal): ``"<description>: done/total label, rate/s,
    ETA s"``, at most one every ``every`` seconds, the first after ``every`` seconds."""

    def __init__(self, stream: TextIO, description: str, every: float) -> None:
        self.stream, self.description, self.every = stream, description, every
        self.start = self.last = time.monotonic()
        self.state: tuple[int, int | None, str] | None = None
        self.written = False

    def __call__(self, done: int, total: int | None, label: str) -> None:
        self.state = (done, total, label)
        now = time.monotonic()
        if now - self.last >= self.every:
            self._write(now)

    def _write(self, now: float) -> None:
        done, total, label = self.state
        spent = now - self.start
        rate = done / spent if spent > 0 else 0.0
        text = f"{self.description}: {done}" + (f"/{total}" if total is not None else "")
        text += f" {label}".rstrip() + f", {rate:.2f}/s"
        if total is not None and rate > 0 and done < total:
            text += f", ETA {(total - done) / rate:.0f} s"
        print(text + f" ({spent:.0f} s)", file=self.stream, flush=True)
        self.last, self.written = now, True

    def close(self) -> None:
        if self.written and self.state is not None:
            self._write(time.monotonic())
            self.written = False


def peak_memory_line() -> str | None:
    """``"peak memory: 612 MB resident"``: this process's largest resident set so far
    (``getrusage``; Linux counts KiB, macOS bytes), or None where it cannot be read."""
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024
    return f"peak memory: {peak * scale / 1e6:.0f} MB resident"
