"""Progress on a terminal, with ``rich``: a bar (or a spinner when the total is unknown)
on stderr while long work runs (``check``, ``golden update``, ``rollout``, ``audit
--rescore``, ``probe model``).

Nothing is drawn when stderr is not a terminal (a pipe, a CI log, a file) or when ``CI``
is set: those outputs, stdout and ``--json`` are byte for byte what they were without
progress. :class:`Progress` is the battery's progress callback ``(done, total, label)``.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO


def on_terminal(stream: TextIO) -> bool:
    """Whether progress may be drawn on ``stream``: a terminal, outside CI."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty()) and not os.environ.get("CI")


class Progress:
    """``(done, total, label)`` -> a rich bar on ``stream`` (default stderr), only on a
    terminal (:func:`on_terminal`); the bar ends when ``done == total`` or at
    :meth:`close`. ``description``: the bar's title."""

    def __init__(self, description: str = "", stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.description = description
        self.enabled = on_terminal(self.stream)
        self._bar = None
        self._task = None

    def __call__(self, done: int, total: int | None, label: str = "") -> None:
        if not self.enabled:
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            console = Console(file=self.stream, force_terminal=True)
            self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                            transient=False)
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
        """End the bar (its last state stays on the terminal)."""
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.stop()
