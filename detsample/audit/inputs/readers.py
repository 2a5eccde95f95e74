"""Readers of record-shaped audit inputs (JSONL files, in-memory records), streamed in chunks.

Every reader yields :class:`~detsample.audit.inputs.table.TableChunk` objects: a run of
consecutive sequences, column by column, under the file's own column names (the ones a
:class:`~detsample.audit.inputs.layout.Resolved` layout asks for). Readers only parse; the value
checks (NaN, positive logprobs, count mismatches...) live in :mod:`detsample.audit.running.validate`
and are the same for every format. A sequence a reader cannot parse (bad JSON, a field of
the wrong type) is kept in the chunk with a parse issue, so it is excluded and counted.

Formats (default column names; ``--columns`` / ``--preset`` rename them):

* JSONL: one JSON object per line with ``id``, ``prompt_ids``, ``response_ids``,
  ``engine_logprobs`` and optionally ``trainer_logprobs`` and ``mask`` (1 = trained).
* NPZ, Parquet, torch ``.pt``: :mod:`detsample.audit.inputs.npz`, :mod:`detsample.audit.inputs.parquet`,
  :mod:`detsample.audit.inputs.torchfile`.

Locations: JSONL issues name the 1-based line; the other formats the 0-based row.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from detsample.audit.inputs.layout import COLUMN_KINDS, LIST_COLUMNS, REQUIRED_COLUMNS, ROLES, Resolved
from detsample.audit.inputs.source import Source
from detsample.audit.inputs.table import PerRow, Ragged, RawChunk, TableChunk
from detsample.audit.inputs.values import (
    column_array,
    count_of,
    id_of,
    kind_words,
    plain_scalar,
    value_column,
    value_message,
)
from detsample.audit.issues import AuditInputError, Issue, audit_file
from detsample.inputs import AUDIT_LINE_BYTES, loads, read_line

__all__ = [
    "AuditInputError",
    "COLUMN_KINDS",
    "DEFAULT_CHUNK_TOKENS",
    "Issue",
    "JsonlSource",
    "LIST_COLUMNS",
    "REQUIRED_COLUMNS",
    "RawChunk",
    "arrow_to_table",
    "iter_jsonl_chunks",
    "iter_record_chunks",
    "peek_jsonl_keys",
    "split_jsonl",
]

DEFAULT_CHUNK_TOKENS = 1 << 18
NEWLINE = b"\n"
#: the response-side columns whose sizes measure a chunk (tokens per chunk)
_SIZE_COLUMNS = ("response_ids", "input_ids")


# --------------------------------------------------------------------------- records / JSONL


class _Value:
    """A record's stated per-row value (role "value"), kept as it is."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value


class _ChunkBuilder:
    """Accumulates parsed records (mappings) into TableChunks of about ``chunk_tokens``
    response tokens, reading the file columns that ``resolved`` asks for."""

    def __init__(self, source: str, unit: str, chunk_tokens: int, resolved: Resolved) -> None:
        self.source, self.unit, self.chunk_tokens = source, unit, chunk_tokens
        self.id_col = resolved.id_column
        self.wants = [(c, d) for c, d in resolved.wants() if c != self.id_col]
        self.required = set(resolved.required())
        self.size_cols = [c for c, d in self.wants if d in _SIZE_COLUMNS]
        self._reset()

    def _reset(self) -> None:
        self.ids: list[str] = []
        self.lines: list[int] = []
        self.parts: dict[str, list[np.ndarray]] = {c: [] for c, _ in self.wants}
        self.lens: dict[str, list[int]] = {c: [] for c, _ in self.wants}
        self.vals: dict[str, list] = {c: [] for c, d in self.wants if ROLES[d] == "value"}
        self.flagged: dict[int, Issue] = {}
        self.tokens = 0

    def _issue(self, line: int, fieldname: str, kind: str, message: str) -> Issue:
        return Issue(self.source, line, fieldname, kind, message, self.unit)

    def _row(self, rid: str, line: int) -> None:
        self.ids.append(rid)
        self.lines.append(line)
        for v in self.vals.values():
            v.append(None)  # not stated unless the record gives it

    def add_bad(self, line: int, issue: Issue, rid: str = "") -> None:
        self.flagged[len(self.ids)] = issue
        self._row(rid, line)
        for c, _ in self.wants:
            self.lens[c].append(-1)

    def add(self, line: int, rec: object) -> None:
        if not isinstance(rec, Mapping):
            what = "a JSON object" if self.unit == "line" else "a record (a dict of columns)"
            self.add_bad(line, self._issue(line, "<record>", "bad_type", f"expected {what}, got {type(rec).__name__}"))
            return
        if self.id_col is None:
            rid: object = line
        else:
            if self.id_col not in rec:
                self.add_bad(line, self._issue(line, self.id_col, "missing_column", f"missing column '{self.id_col}'"))
                return
            rid, why = id_of(rec[self.id_col])
            if why is not None:
                self.add_bad(line, self._issue(line, self.id_col, "bad_type", why))
                return
        arrays: dict[str, np.ndarray | int] = {}
        for c, dst in self.wants:
            v = rec.get(c)
            if v is None:
                if c in self.required:
                    self.add_bad(line, self._issue(line, c, "missing_column", f"missing column '{c}'"), str(rid))
                    return
                continue
            if ROLES[dst] == "value":  # a stated semantics value: judged by validation
                arrays[c] = _Value(plain_scalar(v))
                continue
            if ROLES[dst] == "row":
                a, kind, problem = count_of(v)
            else:
                a, kind, problem = column_array(dst, v)
            if problem:
                self.add_bad(line, self._issue(line, c, kind, problem), str(rid))
                return
            arrays[c] = a
        self._row(str(rid), line)
        for c, _ in self.wants:
            a = arrays.get(c)
            if isinstance(a, _Value):
                self.vals[c][-1] = a.value
            elif a is None:
                self.lens[c].append(-1)
            elif isinstance(a, np.ndarray):
                self.parts[c].append(a)
                self.lens[c].append(a.size)
            else:  # a per-row count
                self.lens[c].append(a)
        self.tokens += 1 + sum(
            arrays[c].size
            for c in self.size_cols  # type: ignore[union-attr]
            if c in arrays
        )

    def full(self) -> bool:
        return self.tokens >= self.chunk_tokens

    def take(self) -> TableChunk | None:
        if not self.ids:
            return None
        cols: dict = {}
        if self.id_col is not None:
            cols[self.id_col] = PerRow(self.ids)
        for c, dst in self.wants:
            if ROLES[dst] == "value":
                cols[c] = PerRow(value_column(self.vals[c]))
                continue
            lengths = np.asarray(self.lens[c], dtype=np.int64)
            if ROLES[dst] == "row":
                cols[c] = PerRow(lengths)
                continue
            parts = self.parts[c]
            if parts:
                values = np.concatenate(parts) if len(parts) > 1 else parts[0]
            else:
                values = np.empty(0, dtype=np.float64 if "logprob" in dst else np.int64)
            cols[c] = Ragged(values, lengths)
        chunk = TableChunk(self.source, self.unit, np.asarray(self.lines, dtype=np.int64), cols, self.flagged)
        self._reset()
        return chunk


def iter_record_chunks(
    records: Iterable[object],
    resolved: Resolved,
    source: str = "<records>",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    first_row: int = 0,
) -> Iterator[TableChunk]:
    """Chunks from in-memory records (mappings; values lists or arrays). Locations are
    0-based record indices (unit "row"), counted from ``first_row``."""
    items: Iterable[tuple[int, object]] = enumerate(records, start=first_row)
    if resolved.layout.records == "openai":
        items = _openai_items(source, "row", items)
    yield from _build_chunks(_ChunkBuilder(source, "row", chunk_tokens, resolved), items)


def _openai_items(source: str, unit: str, items: Iterable[tuple[int, object]]) -> Iterator[tuple[int, object]]:
    """OpenAI-compatible responses -> one record (or a located Issue) per choice."""
    from detsample.audit.inputs.openai import records_of

    for loc, obj in items:
        if isinstance(obj, Issue):
            yield loc, obj
            continue
        for rec in records_of(obj):
            yield loc, (rec if isinstance(rec, dict) else Issue(source, loc, *rec, unit))


def _build_chunks(b: _ChunkBuilder, items: Iterable[tuple[int, object]]) -> Iterator[TableChunk]:
    """Feed (location, record or parse Issue) pairs to a builder; yield its chunks."""
    for loc, rec in items:
        if isinstance(rec, Issue):
            b.add_bad(loc, rec)
        else:
            b.add(loc, rec)
        if b.full():
            yield b.take()  # type: ignore[misc]
    last = b.take()
    if last is not None:
        yield last


def _parse_json_lines(path: str, lines: list[tuple[int, bytes]]) -> Iterator[tuple[int, object]]:
    """(line number, parsed object or a bad_json Issue) for each line, with :mod:`json`."""
    for k, ln in lines:
        try:
            yield k, loads(ln)
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, JsonTooDeep
            msg = (
                f"invalid JSON: {exc.msg} (column {exc.colno})"
                if isinstance(exc, json.JSONDecodeError)
                else f"invalid UTF-8: {exc}"
                if isinstance(exc, UnicodeDecodeError)
                else f"invalid JSON: {exc}"
            )
            yield k, Issue(path, k, "<line>", "bad_json", msg, "line")


class JsonlSource(Source):
    """A JSONL audit input (one record, or one OpenAI-compatible response, per line): its
    columns are the first record's keys, its shards byte ranges on line boundaries."""

    def __init__(self, path: str) -> None:
        self.path = str(path)
        self.resolved: Resolved | None = None

    def columns(self) -> list[str]:
        return peek_jsonl_keys(self.path)

    def bind(self, resolved: Resolved) -> JsonlSource:
        self.resolved = resolved
        return self

    def shards(self, parts: int) -> list[tuple[int, int, int]]:
        return split_jsonl(self.path, parts)

    def chunks(self, start: int, stop: int, first_line: int, chunk_tokens: int, parser: str) -> Iterator[TableChunk]:
        return iter_jsonl_chunks(self.path, self.resolved, start, stop, first_line, chunk_tokens, parser)


def peek_jsonl_keys(path: str) -> list[str]:
    """The keys of the first JSON object of a JSONL file (what a layout resolves against);
    [] when the first non-blank line is not a JSON object."""
    with open(audit_file(path), "rb") as f:
        for k in itertools.count(1):
            ln = read_line(f, AUDIT_LINE_BYTES, f"{path}:line {k}")
            if not ln:
                break
            if ln.strip():
                try:
                    rec = loads(ln)
                except (ValueError, UnicodeDecodeError):  # named where the line is read
                    return []
                return list(rec) if isinstance(rec, dict) else []
    return []


def iter_jsonl_chunks(
    path: str,
    resolved: Resolved,
    start: int = 0,
    end: int | None = None,
    first_line: int = 1,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    parser: str = "auto",
) -> Iterator[TableChunk]:
    """Chunks of the JSONL lines whose first byte lies in [start, end) (start must be the
    beginning of a line, ``first_line`` its 1-based number). Blank lines are skipped.

    parser: "auto" parses blocks of lines with pyarrow's JSON reader and falls back to
    :mod:`json` line by line for any block it does not accept cleanly (bad lines are
    then named exactly); "python" always uses :mod:`json`. Both give the same chunks."""
    if parser not in ("auto", "python"):
        raise ValueError(f"parser must be 'auto' or 'python', got {parser!r}")
    block_bytes = max(chunk_tokens * 32, 1)
    with open(path, "rb") as f:
        f.seek(0, 2)
        end = f.tell() if end is None else end
        f.seek(start)
        pos, line_no = start, first_line
        while pos < end:
            buf = f.read(min(block_bytes, end - pos))
            if not buf:
                break
            if not buf.endswith(b"\n") and pos + len(buf) < end:  # complete the last line
                last = line_no + buf.count(NEWLINE)
                buf += read_line(f, AUDIT_LINE_BYTES, f"{path}:line {last}")  # end: a boundary
            pos += len(buf)
            raw_lines = buf.split(b"\n")
            if buf.endswith(b"\n"):
                raw_lines.pop()
            nonblank = [(line_no + i, ln) for i, ln in enumerate(raw_lines) if ln.strip()]
            line_no += len(raw_lines)
            if not nonblank:
                continue
            lines = np.array([k for k, _ in nonblank], dtype=np.int64)
            openai = resolved.layout.records == "openai"  # nested responses: json only
            chunk = _arrow_jsonl_block(buf, str(path), lines, resolved) if parser == "auto" and not openai else None
            if chunk is not None:
                yield chunk
                continue
            items = _parse_json_lines(str(path), nonblank)
            if openai:
                items = _openai_items(str(path), "line", items)
            yield from _build_chunks(_ChunkBuilder(str(path), "line", chunk_tokens, resolved), items)


def split_jsonl(path: str, parts: int) -> list[tuple[int, int, int]]:
    """Split a JSONL file into <= ``parts`` byte ranges on line boundaries.

    Returns (start, end, first_line) triples covering the file in order."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        cuts = [0]
        for k in range(1, parts):
            target = max(k * size // parts - 1, 0)
            f.seek(target)  # to the end of the line holding the target byte
            read_line(f, AUDIT_LINE_BYTES, f"{path}: the line holding byte {target}")
            pos = f.tell()
            if cuts[-1] < pos < size:
                cuts.append(pos)
        cuts.append(size)
        out, line = [], 1
        for a, b in zip(cuts[:-1], cuts[1:]):
            out.append((a, b, line))
            line += _count_newlines(f, a, b)
    return out


def _count_newlines(f, start: int, end: int, block: int = 1 << 24) -> int:
    f.seek(start)
    n, left = 0, end - start
    while left > 0:
        buf = f.read(min(block, left))
        if not buf:
            break
        n += buf.count(b"\n")
        left -= len(buf)
    return n


# --------------------------------------------------------------------------- Arrow


def arrow_value_type_ok(column: str, vt) -> bool:
    """Whether an Arrow list's value type suits canonical column ``column``."""
    import pyarrow as pa

    kinds = COLUMN_KINDS[column]
    return (
        pa.types.is_integer(vt)
        or ("f" in kinds and pa.types.is_floating(vt))
        or ("b" in kinds and pa.types.is_boolean(vt))
    )


def _fill_nulls(flat):
    """Nulls (their rows are flagged already) replaced by a value of the array's own type,
    so the column keeps its dtype for the rows that are read."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = flat.type
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return pc.fill_null(flat, pa.scalar(0, type=t))
    if pa.types.is_boolean(t):
        return pc.fill_null(flat, False)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pc.fill_null(flat, "")
    return flat


def arrow_is_list(t) -> bool:
    import pyarrow as pa

    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def arrow_to_table(table, source: str, unit: str, lines: np.ndarray, resolved: Resolved) -> TableChunk:
    """A TableChunk from an Arrow table or record batch holding the columns ``resolved``
    asks for (types already checked). Null ids and nulls inside lists flag their row; a
    null list is an absent column for that row (length -1); a per-row count column
    (response_length) is read as int64 (-1 where null)."""
    import pyarrow.compute as pc

    n = table.num_rows
    names = table.schema.names
    flagged: dict[int, Issue] = {}
    cols: dict = {}
    id_col = resolved.id_column
    if id_col is not None and id_col in names:
        cols[id_col] = PerRow(ids_column(table.column(id_col).to_pylist(), id_col, source, unit, lines, flagged))
    for c, dst in resolved.wants():
        if c == id_col or c not in names:
            continue
        col = table.column(c)
        if ROLES[dst] == "value":
            cols[c] = PerRow(value_column(col.to_pylist()))
            continue
        if ROLES[dst] == "row":
            counts = pc.fill_null(col, -1).to_numpy(zero_copy_only=False).astype(np.int64)
            nulls = np.asarray(col.is_null())
            for k in np.flatnonzero((counts < 0) & ~nulls).tolist():  # the count rule
                _, kind, problem = count_of(int(counts[k]))
                flagged.setdefault(k, Issue(source, int(lines[k]), c, kind, problem, unit))
            cols[c] = PerRow(counts)
            continue
        lens = pc.fill_null(pc.list_value_length(col), -1).to_numpy(zero_copy_only=False)
        flat = pc.list_flatten(col)
        if len(flat) != int(np.maximum(lens, 0).sum()):
            raise AuditInputError(
                f"{source}: {c}: the list column's values do not match its "
                f"lengths ({len(flat)} values for "
                f"{int(np.maximum(lens, 0).sum())})"
            )
        if flat.null_count:
            owner = np.repeat(np.arange(n), np.maximum(lens, 0))
            starts = np.concatenate([[0], np.cumsum(np.maximum(lens, 0))])
            nulls = np.flatnonzero(np.asarray(flat.is_null()))
            for pos in nulls[np.unique(owner[nulls], return_index=True)[1]].tolist():
                k = int(owner[pos])
                flagged.setdefault(
                    k,
                    Issue(
                        source,
                        int(lines[k]),
                        c,
                        "bad_type",
                        value_message(c, pos - int(starts[k]), None, f"values must be {kind_words(dst)}"),
                        unit,
                    ),
                )
            flat = _fill_nulls(flat)
        cols[c] = Ragged(flat.to_numpy(zero_copy_only=False), lens.astype(np.int64))
    return TableChunk(source, unit, np.asarray(lines, dtype=np.int64), cols, flagged)


def ids_column(
    values: list, id_col: str, source: str, unit: str, lines: np.ndarray, flagged: dict[int, Issue]
) -> list[str]:
    """The ids of a typed column (Parquet, NPZ, tensors, lists) by :func:`id_of`, the rule
    JSONL follows too: a null, a float or a bool excludes its row (``bad_type``), recorded
    in ``flagged``."""
    kinds = set(map(type, values))
    if kinds <= {str}:  # the common columns, whole (the rule's result without a call a row)
        return list(values)
    if kinds <= {int}:
        return list(map(str, values))
    out = []
    for k, x in enumerate(values):
        rid, why = id_of(x)
        if why is not None:
            flagged.setdefault(k, Issue(source, int(lines[k]), id_col, "bad_type", why, unit))
            rid = ""
        out.append(rid)
    return out


def _plain_value_type(column: str, t) -> bool:
    """Whether pyarrow's JSON reader keeps per-row values of type ``t`` as :mod:`json`
    reads them: strings for ``logprobs_mode``, integers for ``top_k`` (a block mixing 50
    and 50.5 reads as doubles, and 50.0 is no top_k), numbers for the rest."""
    import pyarrow as pa

    if column == "logprobs_mode":
        return pa.types.is_string(t)
    if column == "top_k":
        return pa.types.is_integer(t)
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _arrow_jsonl_block(block: bytes, source: str, lines: np.ndarray, resolved: Resolved) -> TableChunk | None:
    """:func:`_arrow_jsonl_block_of`, or None (the line-by-line path, which names the bad
    line) for any block pyarrow reads into something it cannot then describe (a key that
    is not UTF-8, say)."""
    import pyarrow as pa

    try:
        return _arrow_jsonl_block_of(block, source, lines, resolved)
    except (pa.ArrowException, UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError, OverflowError):
        return None


def _arrow_jsonl_block_of(block: bytes, source: str, lines: np.ndarray, resolved: Resolved) -> TableChunk | None:
    """Parse a block of complete JSONL lines with pyarrow's JSON reader (C++, one thread).

    Returns None unless the block is clean: one object per non-blank line, ids strings or
    integers, list columns of the right value types, no null inside a list or id. The
    caller then parses the block line by line with :mod:`json` (the reference path), so
    both paths give the same chunk for every block the fast path accepts."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    try:
        table = pj.read_json(
            pa.BufferReader(block), read_options=pj.ReadOptions(use_threads=False, block_size=len(block) + 1)
        )
    except (pa.ArrowException, ValueError):
        return None
    schema = table.schema
    id_col = resolved.id_column
    if table.num_rows != len(lines) or (id_col is not None and id_col not in schema.names):
        return None
    if id_col is not None:
        idt = schema.field(id_col).type
        if not (pa.types.is_string(idt) or pa.types.is_integer(idt)) or table.column(id_col).null_count:
            return None
    drop = []
    for c, dst in resolved.wants():
        if c == id_col or c not in schema.names:
            continue
        t = schema.field(c).type
        if pa.types.is_null(t):  # only nulls: absent everywhere in this block
            drop.append(c)
            continue
        if ROLES[dst] == "value":
            if not _plain_value_type(dst, t):
                return None
            continue
        if ROLES[dst] == "row":
            if not pa.types.is_integer(t) or pc.min(table.column(c)).as_py() < 0:
                return None
            continue
        if not arrow_is_list(t) or not arrow_value_type_ok(dst, t.value_type):
            return None
        if "mask" in dst and pa.types.is_floating(t.value_type):
            return None  # JSON integers pyarrow widened to double: json names them exactly
        col = table.column(c)
        flat = pc.list_flatten(col)
        if flat.null_count or len(flat) != (pc.sum(pc.list_value_length(col)).as_py() or 0):
            # a null in a list; or pyarrow's JSON reader dropping a leading null from a list
            # while keeping its length ([null, 4] read as [4, 0]): json reads it as written
            return None
    return arrow_to_table(table.drop_columns(drop), source, "line", lines, resolved)
