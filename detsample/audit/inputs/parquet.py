"""Parquet audit inputs, read in record batches (optionally a subset of row groups).

Per-token columns are list columns: ragged, or padded (every row the same length, the
layout's masks saying which entries are real; ``fixed_size_list`` columns are read as
2-D arrays directly). Per-sequence columns (``id``, ``response_length``) are scalars.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from detsample.audit.inputs.layout import ROLES, Resolved
from detsample.audit.inputs.readers import arrow_is_list, arrow_to_table
from detsample.audit.inputs.source import Source, row_shards
from detsample.audit.inputs.table import Padded, Ragged, TableChunk
from detsample.audit.issues import AuditInputError


class ParquetSource(Source):
    """A Parquet audit input: schema checked at :meth:`bind`, read by row groups."""

    def __init__(self, path: str) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path = str(path)
        try:
            self._pf = pq.ParquetFile(self.path)
            md = self._pf.metadata
            self.row_group_rows = [md.row_group(k).num_rows for k in range(md.num_row_groups)]
            self.num_sequences = md.num_rows
            self._names = list(self._pf.schema_arrow.names)
            self._schema = self._pf.schema_arrow
        except (OSError, pa.ArrowException, ValueError, UnicodeDecodeError, IndexError, KeyError, TypeError) as exc:
            why = "; ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
            raise AuditInputError(f"{self.path}: not a readable Parquet file ({why})") from exc
        self.resolved: Resolved | None = None

    def columns(self) -> list[str]:
        return list(self._names)

    def shards(self, parts: int) -> list[tuple[int, int, int]]:
        """Shards of whole row groups (a row group is read at once)."""
        return row_shards(len(self.row_group_rows), parts)

    def chunks(self, start: int, stop: int, first_line: int, chunk_tokens: int, parser: str) -> Iterator[TableChunk]:
        """The chunks of row groups [start, stop)."""
        return self.iter_chunks(list(range(start, stop)), chunk_rows=max(chunk_tokens // 256, 64))

    def bind(self, resolved: Resolved) -> ParquetSource:
        """Check the types of the columns ``resolved`` reads (fatal errors name the file
        and the column)."""
        import pyarrow as pa

        schema = self._schema
        id_col = resolved.id_column
        if id_col is not None and id_col not in self._names:
            raise AuditInputError(f"{self.path}: missing column '{id_col}'")
        for c, dst in resolved.wants():
            if c == id_col or c not in self._names:
                continue
            t = schema.field(c).type
            if ROLES[dst] == "value":  # one scalar per row, judged row by row
                if arrow_is_list(t) or pa.types.is_struct(t) or pa.types.is_map(t):
                    raise AuditInputError(f"{self.path}: {c}: one value per sequence expected, got a column of {t}")
                continue
            if ROLES[dst] == "row":
                if not pa.types.is_integer(t):
                    raise AuditInputError(f"{self.path}: {c}: must be an integer column, got {t}")
                continue
            if not arrow_is_list(t):
                raise AuditInputError(f"{self.path}: {c}: must be a list column, got {t}")
            # values of the wrong kind (list<string> logprobs, ...) exclude their rows, as in
            # every format (detsample.audit.inputs.values); only the shape of the column is fatal
        self.resolved = resolved
        self._columns = ([id_col] if id_col is not None else []) + [
            c for c, _ in resolved.wants() if c != id_col and c in self._names
        ]
        self._fixed = {c for c in self._columns if pa.types.is_fixed_size_list(schema.field(c).type)}
        return self

    def _batches(self, chunk_rows: int, groups: list[int]) -> Iterator:
        """The record batches; a page that cannot be decoded is an AuditInputError naming
        the file."""
        import pyarrow as pa

        it = self._pf.iter_batches(batch_size=chunk_rows, row_groups=groups, columns=self._columns, use_threads=False)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except (pa.ArrowException, OSError, ValueError) as exc:
                why = "; ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
                raise AuditInputError(f"{self.path}: not a readable Parquet file ({why})") from exc
            yield batch

    def iter_chunks(self, row_groups: list[int] | None = None, chunk_rows: int = 2048) -> Iterator[TableChunk]:
        assert self.resolved is not None
        groups = list(range(len(self.row_group_rows))) if row_groups is None else list(row_groups)
        if not groups:
            return
        row = sum(self.row_group_rows[: groups[0]])
        if groups != list(range(groups[0], groups[0] + len(groups))):
            raise ValueError("row_groups must be consecutive")
        for batch in self._batches(chunk_rows, groups):
            n = batch.num_rows
            try:
                chunk = arrow_to_table(batch, self.path, "row", np.arange(row, row + n, dtype=np.int64), self.resolved)
            except UnicodeDecodeError as exc:  # a string that is not UTF-8
                raise AuditInputError(f"{self.path}: rows {row}..{row + n - 1}: not UTF-8 text ({exc})") from exc
            for c in self._fixed:  # fixed-size lists are padded 2-D arrays
                col = chunk.cols.get(c)
                if isinstance(col, Ragged) and col.lengths.size and (col.lengths >= 0).all():
                    chunk.cols[c] = Padded(col.values.reshape(n, -1))
            yield chunk
            row += n
