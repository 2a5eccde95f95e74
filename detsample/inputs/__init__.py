"""The one input layer of the commands: what a file, a JSON text and a thread count must be
before anything reads or uses them.

* ``files``: inputs are regular files (a symlink is followed): a FIFO, a device, a socket
  or a directory is named and refused before anything opens it (a FIFO would block for
  ever, ``/dev/zero`` would be read until the machine runs out of memory); reads of whole
  files and of single lines are bounded by a stated limit (``limits``).
* ``jsontext``: JSON parsed with the nesting bounded (a structure deeper than the
  parser's limit is a named error, never a ``RecursionError``).
* ``limits``: the size limits, and the thread counts the machine allows.
* ``numbers``: numbers spelt plainly (``1_2_3``, `` 5 `` and non-ASCII digits refused).

Every refusal is an :class:`InputError` naming the file (or option) and the value.
"""

from __future__ import annotations

from detsample.inputs.files import InputError, file_kind, file_problem, input_file, read_bounded, read_line
from detsample.inputs.jsontext import JSON_DEPTH_WHY, loads
from detsample.inputs.limits import (
    AUDIT_LINE_BYTES,
    AUDIT_SEQUENCE_BYTES,
    AUDIT_SEQUENCE_TOKENS,
    GOLDEN_FILE_BYTES,
    LOG_LINE_BYTES,
    PROMPT_LINE_BYTES,
    max_threads,
    memory_problem,
    thread_problem,
)
from detsample.inputs.numbers import parse_float, parse_int

__all__ = [
    "AUDIT_LINE_BYTES",
    "AUDIT_SEQUENCE_BYTES",
    "AUDIT_SEQUENCE_TOKENS",
    "GOLDEN_FILE_BYTES",
    "InputError",
    "JSON_DEPTH_WHY",
    "LOG_LINE_BYTES",
    "PROMPT_LINE_BYTES",
    "file_kind",
    "file_problem",
    "input_file",
    "loads",
    "max_threads",
    "memory_problem",
    "parse_float",
    "parse_int",
    "read_bounded",
    "read_line",
    "thread_problem",
]
