"""The protocol every audit input format implements once (:class:`Source`), and the
shared row-range sharding of the formats read by rows.

A source is opened on a path, tells its column names, is bound to a resolved layout
(structural errors are fatal there, named by file and column), splits itself into
contiguous shards and yields :class:`~detsample.audit.inputs.table.TableChunk` s of one
shard; it is a context manager that releases what it holds (an NPZ's zip file).
Adding a format is one module with a ``Source`` and one row of
:data:`detsample.audit.inputs.formats.FORMATS` (docs/audit.md, "Adding a format").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class Source:
    """Base of the format sources. A subclass sets ``path`` and ``num_sequences`` (after
    :meth:`bind`) and implements ``columns``, ``bind`` and ``iter_chunks(start, stop,
    chunk_tokens)``; it overrides :meth:`shards` / :meth:`chunks` when its shards are not
    row ranges (JSONL: byte ranges; Parquet: row groups) and :meth:`close` when it holds a
    resource."""

    path: str
    num_sequences: int = 0

    def columns(self) -> list[str]:  # pragma: no cover - every format implements it
        raise NotImplementedError

    def bind(self, resolved: Any) -> Source:  # pragma: no cover
        raise NotImplementedError

    def shards(self, parts: int) -> list[tuple[int, int, int]]:
        """At most ``parts`` contiguous ``(start, stop, first_line)`` shards in order (rows
        here; one empty shard for an empty file)."""
        return row_shards(self.num_sequences, parts)

    def chunks(self, start: int, stop: int, first_line: int, chunk_tokens: int, parser: str) -> Iterator:
        """The table chunks of one shard (``first_line`` and ``parser``: JSONL's)."""
        return self.iter_chunks(start, stop, chunk_tokens)  # type: ignore[attr-defined]

    def close(self) -> None:
        """Release what the source holds (nothing by default)."""

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def row_shards(n: int, parts: int) -> list[tuple[int, int, int]]:
    """``n`` units split into at most ``parts`` contiguous ``(start, stop, 1)`` ranges."""
    cuts = sorted({n * k // parts for k in range(parts + 1)})
    return [(a, b, 1) for a, b in zip(cuts[:-1], cuts[1:])] or [(0, 0, 1)]
