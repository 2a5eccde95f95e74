"""The one output layer of the commands: how a file and a stream are written.

* ``files``: every file a command writes (JSONL, NPZ, Parquet, JSON, reports and plots,
  golden files) goes through :func:`write_file`: to a temporary file in the same folder,
  then ``os.replace`` onto the path given, so a failure (a full disk, a file-size limit, an
  exception, Ctrl-C) leaves the old file and no partial one; :func:`output_input_clash`
  refuses an output that is one of the command's inputs (the same path once resolved, or a
  hard link to it) before anything is read.
* ``streams``: stdout and stderr that never end a command: a closed or broken stream drops
  what is written to it (the command keeps its exit code), a name that the stream's
  encoding cannot spell is written with backslash escapes, and while stdout carries
  machine-readable data (``--json -``) everything else printed goes to stderr.

Every failure is an :class:`OutputError` naming the option, the path and the reason.
"""

from __future__ import annotations

from detsample.outputs.files import (
    OutputError,
    append_file,
    output_input_clash,
    output_inside_problem,
    same_file,
    write_file,
)
from detsample.outputs.streams import data_stdout, guarded_streams, stdout_is_data

__all__ = [
    "OutputError",
    "append_file",
    "data_stdout",
    "guarded_streams",
    "output_input_clash",
    "output_inside_problem",
    "same_file",
    "stdout_is_data",
    "write_file",
]
