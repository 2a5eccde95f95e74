"""THE table of rollout file formats: each row names a format, the file name endings that
select it, its :class:`~detsample.audit.inputs.source.Source` and its writer (the
columns of :func:`~detsample.audit.inputs.writers.from_records` to a file; None where
detsample reads the format but does not write it). Detection (:func:`format_of`), the
audit's sharding and reading (:mod:`detsample.audit.running.run`) and ``detsample
rollout``'s output all read this table, so a format is added here and in its own module
(docs/audit.md, "Adding a format")."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from detsample.audit.inputs.npz import NpzSource
from detsample.audit.inputs.parquet import ParquetSource
from detsample.audit.inputs.readers import JsonlSource
from detsample.audit.inputs.source import Source
from detsample.audit.inputs.torchfile import TorchSource
from detsample.audit.inputs.writers import write_jsonl, write_npz, write_parquet
from detsample.audit.issues import AuditInputError


@dataclass(frozen=True)
class Format:
    """A rollout file format: ``name``, the lower-case file name ``endings`` that select
    it, ``source`` (path -> :class:`Source`) and ``writer`` ((columns, path, flag=) ->
    None, atomically at exactly the path; or None)."""

    name: str
    endings: tuple[str, ...]
    source: Callable[[str], Source]
    writer: Callable[..., None] | None = None


FORMATS: tuple[Format, ...] = (
    Format("jsonl", (".jsonl", ".ndjson", ".json", ".jsonl.txt"), JsonlSource, write_jsonl),
    Format("npz", (".npz",), NpzSource, write_npz),
    Format("parquet", (".parquet", ".pq"), ParquetSource, write_parquet),
    Format("pt", (".pt", ".pth"), TorchSource),
)
BY_NAME = {f.name: f for f in FORMATS}


def format_of(path: str | os.PathLike[str], *, written: bool = False) -> Format:
    """The :class:`Format` of ``path`` by its name's ending (case-insensitive); with
    ``written``, only formats detsample writes. AuditInputError names the path and the
    endings otherwise."""
    low = os.fspath(path).lower()
    for f in FORMATS:
        if (f.writer is not None or not written) and low.endswith(f.endings):
            return f
    kinds = [e for f in FORMATS if f.writer is not None or not written for e in f.endings[:1]]
    raise AuditInputError(
        f"{os.fspath(path)}: unknown {'output' if written else 'input'} "
        f"format (expected {', '.join(kinds[:-1])} or {kinds[-1]})"
    )
