"""Readers of audit inputs (JSONL, NPZ, Parquet, in-memory records), streamed in chunks.

Every reader yields :class:`RawChunk` objects: a run of consecutive sequences stored
column by column (flat values + per-sequence lengths). Readers only parse; the value
checks (NaN, positive logprobs, count mismatches...) live in :mod:`detsample.audit.validate`
and are the same for every format. A sequence a reader cannot parse (bad JSON, a field of
the wrong type) is kept in the chunk with a parse issue, so it is excluded and counted.

Formats (the same columns everywhere):

* JSONL: one JSON object per line with ``id``, ``prompt_ids``, ``response_ids``,
  ``engine_logprobs`` and optionally ``trainer_logprobs`` and ``mask`` (1 = trained).
* NPZ: ``id`` [S], and for each list column ``C`` a flat 1-D array ``C`` with
  ``C_offsets`` [S+1] (sequence i is ``C[C_offsets[i]:C_offsets[i+1]]``). Uncompressed
  members are memory-mapped, compressed ones streamed, so files larger than memory work.
* Parquet: columns ``id`` and list columns of the same names (pyarrow), read in batches.

Locations: JSONL issues name the 1-based line; NPZ and Parquet the 0-based row.
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from detsample.errors import DetsampleError

LIST_COLUMNS = ("prompt_ids", "response_ids", "engine_logprobs", "trainer_logprobs", "mask")
REQUIRED_COLUMNS = ("id", "prompt_ids", "response_ids", "engine_logprobs")
OPTIONAL_COLUMNS = ("trainer_logprobs", "mask")
#: numpy dtype kinds accepted per column
COLUMN_KINDS = {
    "prompt_ids": "iu",
    "response_ids": "iu",
    "engine_logprobs": "fiu",
    "trainer_logprobs": "fiu",
    "mask": "biu",
}
DEFAULT_CHUNK_TOKENS = 1 << 18


class AuditInputError(DetsampleError, ValueError):
    """An audit input is malformed (file, line/row and field named)."""


@dataclass(frozen=True)
class Issue:
    """One rejected sequence: where it is, which field, what is wrong."""

    source: str
    line: int
    field: str
    kind: str
    message: str
    unit: str = "line"  # "line" (1-based, JSONL) or "row" (0-based, NPZ/Parquet/records)

    def __str__(self) -> str:
        return f"{self.source}:{self.unit} {self.line}: {self.field}: {self.message}"

    def to_json(self) -> dict:
        return {"source": self.source, self.unit: self.line, "field": self.field,
                "kind": self.kind, "message": self.message}


@dataclass
class RawChunk:
    """Consecutive sequences, column-major, as parsed (not yet validated).

    ids: S ids (str). lines: int64 [S] locations. values[c]: flat values of column c over
    the sequences that have it; lengths[c]: int64 [S], -1 where the sequence lacks c (a
    column absent from the whole chunk may be missing from both dicts).
    flagged: sequence index -> parse issue (those sequences are excluded).
    """

    source: str
    unit: str
    ids: list[str]
    lines: np.ndarray
    values: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]
    flagged: dict[int, Issue] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)


def detect_format(path: str) -> str:
    """"jsonl", "npz" or "parquet" from the file name (".json"/".jsonl"/".ndjson" -> jsonl)."""
    low = str(path).lower()
    if low.endswith((".jsonl", ".ndjson", ".json", ".jsonl.txt")):
        return "jsonl"
    if low.endswith(".npz"):
        return "npz"
    if low.endswith((".parquet", ".pq")):
        return "parquet"
    raise AuditInputError(f"{path}: unknown input format (expected .jsonl, .npz or .parquet)")


# --------------------------------------------------------------------------- records / JSONL


class _ChunkBuilder:
    """Accumulates parsed records (dicts) into RawChunks of about ``chunk_tokens`` tokens."""

    def __init__(self, source: str, unit: str, chunk_tokens: int) -> None:
        self.source, self.unit, self.chunk_tokens = source, unit, chunk_tokens
        self._reset()

    def _reset(self) -> None:
        self.ids: list[str] = []
        self.lines: list[int] = []
        self.parts: dict[str, list[np.ndarray]] = {c: [] for c in LIST_COLUMNS}
        self.lens: dict[str, list[int]] = {c: [] for c in LIST_COLUMNS}
        self.flagged: dict[int, Issue] = {}
        self.tokens = 0

    def _issue(self, line: int, fieldname: str, kind: str, message: str) -> Issue:
        return Issue(self.source, line, fieldname, kind, message, self.unit)

    def add_bad(self, line: int, issue: Issue, rid: str = "") -> None:
        self.flagged[len(self.ids)] = issue
        self.ids.append(rid)
        self.lines.append(line)
        for c in LIST_COLUMNS:
            self.lens[c].append(-1)

    def add(self, line: int, rec: object) -> None:
        if not isinstance(rec, Mapping):
            self.add_bad(line, self._issue(line, "<record>", "bad_type",
                                           f"expected a JSON object, got {type(rec).__name__}"))
            return
        rid = rec.get("id")
        if rid is None:
            self.add_bad(line, self._issue(line, "id", "missing_column", "missing column 'id'"))
            return
        if not isinstance(rid, (str, int)) or isinstance(rid, bool):
            self.add_bad(line, self._issue(line, "id", "bad_type",
                                           f"id must be a string or an integer, got {rid!r:.60}"))
            return
        arrays: dict[str, np.ndarray] = {}
        for c in LIST_COLUMNS:
            v = rec.get(c)
            if v is None:
                if c in REQUIRED_COLUMNS:
                    self.add_bad(line, self._issue(line, c, "missing_column",
                                                   f"missing column '{c}'"), str(rid))
                    return
                continue
            a, problem = _as_column(c, v)
            if problem is not None:
                self.add_bad(line, self._issue(line, c, *problem), str(rid))
                return
            arrays[c] = a
        self.ids.append(str(rid))
        self.lines.append(line)
        for c in LIST_COLUMNS:
            a = arrays.get(c)
            if a is None:
                self.lens[c].append(-1)
            else:
                self.parts[c].append(a)
                self.lens[c].append(a.size)
        self.tokens += arrays["response_ids"].size + 1

    def full(self) -> bool:
        return self.tokens >= self.chunk_tokens

    def take(self) -> RawChunk | None:
        if not self.ids:
            return None
        values = {}
        lengths = {}
        for c in LIST_COLUMNS:
            lengths[c] = np.asarray(self.lens[c], dtype=np.int64)
            parts = self.parts[c]
            if parts:
                values[c] = np.concatenate(parts) if len(parts) > 1 else parts[0]
            else:
                values[c] = np.empty(0, dtype=np.float64 if "logprob" in c else np.int64)
        chunk = RawChunk(self.source, self.unit, self.ids, np.asarray(self.lines, dtype=np.int64),
                         values, lengths, self.flagged)
        self._reset()
        return chunk


def _as_column(c: str, v: object) -> tuple[np.ndarray | None, tuple[str, str] | None]:
    """One record's column as a 1-D array of the column's canonical dtype, or a problem
    ``(kind, message)``: kind "ragged" (not a flat list) or "bad_type" (values)."""
    if c != "mask" and isinstance(v, list):  # numpy would coerce False -> 0.0, True -> 1
        bad = next((x for x in v if x is True or x is False), None)
        if bad is not None:
            return None, ("bad_type", f"values must be {_kind_words(c)}, got {bad!r}")
    try:
        a = np.asarray(v)
    except (ValueError, TypeError) as exc:  # ragged nested lists
        return None, ("ragged", f"not a flat list of numbers ({exc})")
    if a.ndim != 1:
        return None, ("ragged", f"must be a flat list, got {a.ndim} dimensions")
    if a.size and a.dtype.kind not in COLUMN_KINDS[c]:
        return None, ("bad_type", f"values must be {_kind_words(c)}, got {_first_bad(a)}")
    if c in ("prompt_ids", "response_ids") and (a.size == 0 or a.dtype.kind == "u"):
        if a.size and a.max() > np.iinfo(np.int64).max:
            return None, ("bad_type", f"token id {a.max()} is out of the int64 range")
        return a.astype(np.int64), None  # [] is float64 for numpy; uint64 + int64 -> float64
    if "logprob" in c and (a.size == 0 or a.dtype.kind in "iu"):
        return a.astype(np.float64), None
    if c == "mask" and a.size == 0:
        return a.astype(bool), None
    return a, None


def _kind_words(column: str) -> str:
    return {"iu": "integers", "fiu": "numbers", "biu": "0/1 or booleans"}[COLUMN_KINDS[column]]


def _first_bad(a: np.ndarray) -> str:
    if a.dtype.kind == "O":
        for x in a.tolist():
            if not isinstance(x, (int, float)) or isinstance(x, bool):
                return f"{x!r:.40}"
    if a.dtype.kind in "US":
        return f"{a.tolist()[0]!r:.40} ({a.dtype})"
    return f"dtype {a.dtype}"


def iter_record_chunks(records: Iterable[object], source: str = "<records>",
                       chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> Iterator[RawChunk]:
    """Chunks from in-memory records (mappings with the JSONL fields; lists or arrays).
    Locations are 0-based record indices (unit "row")."""
    yield from _build_chunks(_ChunkBuilder(source, "row", chunk_tokens), enumerate(records))


def _build_chunks(b: _ChunkBuilder, items: Iterable[tuple[int, object]]) -> Iterator[RawChunk]:
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
            yield k, json.loads(ln)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            msg = (f"invalid JSON: {exc.msg} at column {exc.colno}"
                   if isinstance(exc, json.JSONDecodeError) else f"invalid UTF-8: {exc}")
            yield k, Issue(path, k, "<line>", "bad_json", msg, "line")


def iter_jsonl_chunks(path: str, start: int = 0, end: int | None = None, first_line: int = 1,
                      chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                      parser: str = "auto") -> Iterator[RawChunk]:
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
            if not buf.endswith(b"\n") and pos + len(buf) < end:
                buf += f.readline()  # complete the last line (end is a line boundary)
            pos += len(buf)
            raw_lines = buf.split(b"\n")
            if buf.endswith(b"\n"):
                raw_lines.pop()
            nonblank = [(line_no + i, ln) for i, ln in enumerate(raw_lines) if ln.strip()]
            line_no += len(raw_lines)
            if not nonblank:
                continue
            lines = np.array([k for k, _ in nonblank], dtype=np.int64)
            chunk = _arrow_jsonl_block(buf, str(path), lines) if parser == "auto" else None
            if chunk is not None:
                yield chunk
                continue
            yield from _build_chunks(_ChunkBuilder(str(path), "line", chunk_tokens),
                                     _parse_json_lines(str(path), nonblank))


def split_jsonl(path: str, parts: int) -> list[tuple[int, int, int]]:
    """Split a JSONL file into <= ``parts`` byte ranges on line boundaries.

    Returns (start, end, first_line) triples covering the file in order."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        cuts = [0]
        for k in range(1, parts):
            f.seek(max(k * size // parts - 1, 0))
            f.readline()  # to the end of the line holding the target byte
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


# --------------------------------------------------------------------------- NPZ


class _NpzArray:
    """A 1-D array member of an NPZ file, read by slices without loading it whole:
    memory-mapped when stored uncompressed, streamed through zipfile when compressed."""

    def __init__(self, path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
        self.path, self.name = path, info.filename[:-4]
        with zf.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            header_len = f.tell()
        if dtype.hasobject:
            fix = ("store the ids as a string (dtype=str) or integer array" if self.name == "id"
                   else f"store flat values with '{self.name}_offsets'")
            raise AuditInputError(f"{path}: {self.name}: object arrays are not supported; "
                                  f"{fix} (see docs/audit.md)")
        self.shape, self.dtype, self.fortran = tuple(shape), dtype, fortran
        self._zf, self._info, self._header_len = zf, info, header_len
        self._mm = None
        self._stream = None
        if info.compress_type == zipfile.ZIP_STORED:
            with open(path, "rb") as raw:
                raw.seek(info.header_offset)
                local = raw.read(30)
                name_len, extra_len = struct.unpack("<HH", local[26:30])
            offset = info.header_offset + 30 + name_len + extra_len + header_len
            n = int(np.prod(shape)) if shape else 1
            self._mm = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(n,)) if n else \
                np.empty(0, dtype=dtype)

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    def read(self, start: int, stop: int) -> np.ndarray:
        """Elements [start, stop) as an in-memory array."""
        if self._mm is not None:
            return np.array(self._mm[start:stop])
        if self._stream is None:
            self._stream = self._zf.open(self._info)
        item = self.dtype.itemsize
        self._stream.seek(self._header_len + start * item)
        buf = self._stream.read((stop - start) * item)
        return np.frombuffer(buf, dtype=self.dtype).copy()

    def all(self) -> np.ndarray:
        return self.read(0, len(self))


class NpzSource:
    """An NPZ audit input: column directory, offsets validated at open."""

    def __init__(self, path: str) -> None:
        self.path = str(path)
        try:
            self._zf = zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise AuditInputError(f"{self.path}: not a readable NPZ file ({exc})") from exc
        members = {i.filename[:-4]: i for i in self._zf.infolist() if i.filename.endswith(".npy")}
        self.arrays = {k: _NpzArray(self.path, self._zf, v) for k, v in members.items()}
        if "id" not in self.arrays:
            raise AuditInputError(f"{self.path}: missing column 'id'")
        ids = self.arrays["id"]
        if len(ids.shape) != 1:
            raise AuditInputError(f"{self.path}: id must be 1-D, got shape {ids.shape}")
        self.num_sequences = len(ids)
        self.offsets: dict[str, np.ndarray] = {}
        self.missing = [c for c in REQUIRED_COLUMNS[1:] if c not in self.arrays]
        for c in LIST_COLUMNS:
            if c not in self.arrays:
                continue
            arr = self.arrays[c]
            if len(arr.shape) != 1:
                raise AuditInputError(f"{self.path}: {c}: must be flat (1-D) with {c}_offsets, "
                                      f"got shape {arr.shape}")
            if arr.dtype.kind not in COLUMN_KINDS[c]:
                raise AuditInputError(f"{self.path}: {c}: values must be {_kind_words(c)}, "
                                      f"got dtype {arr.dtype}")
            if f"{c}_offsets" not in self.arrays:
                raise AuditInputError(f"{self.path}: {c}: missing column '{c}_offsets'")
            off = self.arrays[f"{c}_offsets"].all()
            self.offsets[c] = _check_offsets(self.path, c, off, self.num_sequences, len(arr))

    def close(self) -> None:
        self._zf.close()

    def iter_chunks(self, start: int = 0, stop: int | None = None,
                    chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> Iterator[RawChunk]:
        """Chunks of sequences [start, stop) (0-based rows)."""
        stop = self.num_sequences if stop is None else stop
        resp = self.offsets.get("response_ids")
        i = start
        while i < stop:
            if resp is not None:  # about chunk_tokens response tokens per chunk
                j = int(np.searchsorted(resp, resp[i] + chunk_tokens, side="right")) - 1
                j = min(max(j, i + 1), stop)
            else:
                j = min(i + 4096, stop)
            yield self._chunk(i, j)
            i = j

    def _chunk(self, i: int, j: int) -> RawChunk:
        ids = [x if isinstance(x, str) else (x.decode() if isinstance(x, bytes) else str(x))
               for x in self.arrays["id"].read(i, j).tolist()]
        values, lengths = {}, {}
        for c, off in self.offsets.items():
            o = off[i:j + 1]
            values[c] = self.arrays[c].read(int(o[0]), int(o[-1]))
            lengths[c] = np.diff(o)
        for c in self.missing:
            lengths[c] = np.full(j - i, -1, dtype=np.int64)
        return RawChunk(self.path, "row", ids, np.arange(i, j, dtype=np.int64), values, lengths)


def _check_offsets(path: str, column: str, off: np.ndarray, nseq: int, nvalues: int) -> np.ndarray:
    name = f"{column}_offsets"
    if off.ndim != 1 or off.size != nseq + 1:
        raise AuditInputError(f"{path}: {name}: must have len(id) + 1 = {nseq + 1} entries, "
                              f"got shape {off.shape}")
    if off.dtype.kind not in "iu":
        raise AuditInputError(f"{path}: {name}: must be integers, got dtype {off.dtype}")
    off = off.astype(np.int64)
    if off[0] != 0:
        raise AuditInputError(f"{path}: {name}: must start at 0, got {off[0]}")
    bad = np.flatnonzero(np.diff(off) < 0)
    if bad.size:
        raise AuditInputError(f"{path}: {name}: ragged offsets, decreasing at row {bad[0]} "
                              f"({off[bad[0]]} -> {off[bad[0] + 1]})")
    if off[-1] != nvalues:
        raise AuditInputError(f"{path}: {name}: last offset {off[-1]} != number of values "
                              f"{nvalues} in '{column}'")
    return off


# --------------------------------------------------------------------------- Parquet

_PARQUET_VALUE_TYPES = {"iu": "integer", "fiu": "floating point or integer", "biu": "bool or integer"}


class ParquetSource:
    """A Parquet audit input, read in record batches (optionally a subset of row groups)."""

    def __init__(self, path: str) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path = str(path)
        try:
            self._pf = pq.ParquetFile(self.path)
        except (OSError, pa.ArrowException) as exc:
            raise AuditInputError(f"{self.path}: not a readable Parquet file ({exc})") from exc
        schema = self._pf.schema_arrow
        names = set(schema.names)
        if "id" not in names:
            raise AuditInputError(f"{self.path}: missing column 'id'")
        self.columns = [c for c in LIST_COLUMNS if c in names]
        self.missing = [c for c in REQUIRED_COLUMNS[1:] if c not in names]
        for c in self.columns:
            t = schema.field(c).type
            if not _arrow_is_list(t):
                raise AuditInputError(f"{self.path}: {c}: must be a list column, got {t}")
            if not _arrow_value_type_ok(c, t.value_type):
                raise AuditInputError(f"{self.path}: {c}: values must be "
                                      f"{_PARQUET_VALUE_TYPES[COLUMN_KINDS[c]]}, got {t.value_type}")
        md = self._pf.metadata
        self.row_group_rows = [md.row_group(k).num_rows for k in range(md.num_row_groups)]
        self.num_sequences = md.num_rows

    def iter_chunks(self, row_groups: list[int] | None = None,
                    chunk_rows: int = 2048) -> Iterator[RawChunk]:
        groups = list(range(len(self.row_group_rows))) if row_groups is None else list(row_groups)
        if not groups:
            return
        row = sum(self.row_group_rows[:groups[0]])
        if groups != list(range(groups[0], groups[0] + len(groups))):
            raise ValueError("row_groups must be consecutive")
        for batch in self._pf.iter_batches(batch_size=chunk_rows, row_groups=groups,
                                           columns=["id"] + self.columns, use_threads=False):
            n = batch.num_rows
            chunk = arrow_to_chunk(batch, self.path, "row", np.arange(row, row + n, dtype=np.int64))
            for c in self.missing:
                chunk.lengths[c] = np.full(n, -1, dtype=np.int64)
            yield chunk
            row += n


def _arrow_value_type_ok(column: str, vt) -> bool:
    import pyarrow as pa

    kinds = COLUMN_KINDS[column]
    return (pa.types.is_integer(vt) or ("f" in kinds and pa.types.is_floating(vt))
            or ("b" in kinds and pa.types.is_boolean(vt)))


def _arrow_is_list(t) -> bool:
    import pyarrow as pa

    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def arrow_to_chunk(table, source: str, unit: str, lines: np.ndarray) -> RawChunk:
    """A RawChunk from an Arrow table or record batch with the audit's columns (types
    already checked). Null ids and nulls inside lists flag their row; a null list is an
    absent column for that row (length -1)."""
    import pyarrow.compute as pc

    n = table.num_rows
    names = table.schema.names
    ids_col = table.column("id")
    ids = ["" if x is None else str(x) for x in ids_col.to_pylist()]
    flagged: dict[int, Issue] = {}
    if ids_col.null_count:
        for k in np.flatnonzero(np.asarray(ids_col.is_null())).tolist():
            flagged[k] = Issue(source, int(lines[k]), "id", "missing_column",
                               "missing column 'id'", unit)
    values, lengths = {}, {}
    for c in LIST_COLUMNS:
        if c not in names:
            continue
        col = table.column(c)
        lens = pc.fill_null(pc.list_value_length(col), -1).to_numpy(zero_copy_only=False)
        flat = pc.list_flatten(col)
        if flat.null_count:
            owner = np.repeat(np.arange(n), np.maximum(lens, 0))
            for k in np.unique(owner[np.asarray(flat.is_null())]).tolist():
                flagged.setdefault(k, Issue(source, int(lines[k]), c, "bad_type",
                                            "null value inside the list", unit))
            flat = pc.fill_null(flat, 0)
        values[c], lengths[c] = flat.to_numpy(zero_copy_only=False), lens.astype(np.int64)
    return RawChunk(source, unit, ids, np.asarray(lines, dtype=np.int64), values, lengths, flagged)


def _arrow_jsonl_block(block: bytes, source: str, lines: np.ndarray) -> RawChunk | None:
    """Parse a block of complete JSONL lines with pyarrow's JSON reader (C++, one thread).

    Returns None unless the block is clean: one object per non-blank line, ids strings or
    integers, list columns of the right value types, no null inside a list or id. The
    caller then parses the block line by line with :mod:`json` (the reference path), so
    both paths give the same chunk for every block the fast path accepts."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    try:
        table = pj.read_json(pa.BufferReader(block), read_options=pj.ReadOptions(
            use_threads=False, block_size=len(block) + 1))
    except (pa.ArrowException, ValueError):
        return None
    schema = table.schema
    if table.num_rows != len(lines) or "id" not in schema.names:
        return None
    idt = schema.field("id").type
    if not (pa.types.is_string(idt) or pa.types.is_integer(idt)) or table.column("id").null_count:
        return None
    for c in LIST_COLUMNS:
        if c not in schema.names:
            continue
        t = schema.field(c).type
        if pa.types.is_null(t):  # only nulls: absent everywhere in this block
            continue
        if not _arrow_is_list(t) or not _arrow_value_type_ok(c, t.value_type):
            return None
        if pc.list_flatten(table.column(c)).null_count:
            return None
    table = table.drop_columns([c for c in schema.names
                                if c in LIST_COLUMNS and pa.types.is_null(schema.field(c).type)])
    return arrow_to_chunk(table, source, "line", lines)
