"""NPZ audit inputs, read by slices without loading them whole.

A per-token column ``C`` is either ragged, a flat 1-D array ``C`` with ``C_offsets``
[S+1] (sequence i is ``C[C_offsets[i]:C_offsets[i+1]]``), or padded, a 2-D array [S, W]
(one row per sequence; the layout's masks say which entries are real). Per-sequence
columns (``id``, ``response_length``) are 1-D [S]. Uncompressed members are
memory-mapped, compressed ones streamed, so files larger than memory work.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Iterator

import numpy as np

from detsample.audit.inputs.layout import COLUMN_KINDS, ROLES, Resolved
from detsample.audit.inputs.readers import DEFAULT_CHUNK_TOKENS, ids_column
from detsample.audit.inputs.source import Source
from detsample.audit.inputs.table import Padded, PerRow, Ragged, TableChunk
from detsample.audit.inputs.values import kind_words, value_column
from detsample.audit.issues import AuditInputError
from detsample.inputs import AUDIT_SEQUENCE_TOKENS

#: what zipfile, zlib and numpy's header parser raise on a damaged NPZ (an encrypted or
#: unsupported member, a bad CRC, a truncated stream, a malformed .npy header)
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    OSError,
    EOFError,
    ValueError,
    KeyError,
    NotImplementedError,
    RuntimeError,
    struct.error,
    SyntaxError,
    TypeError,
)


class _NpzArray:
    """An array member of an NPZ file, read by rows without loading it whole:
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
            fix = (
                "store the ids as a string (dtype=str) or integer array"
                if self.name == "id"
                else f"store flat values with '{self.name}_offsets' or a padded 2-D array"
            )
            raise AuditInputError(f"{path}: {self.name}: object arrays are not supported; {fix} (see docs/audit.md)")
        if fortran and len(shape) > 1:
            raise AuditInputError(
                f"{path}: {self.name}: Fortran-ordered arrays are not supported; save np.ascontiguousarray({self.name})"
            )
        self.shape, self.dtype = tuple(shape), dtype
        self.row_size = int(np.prod(shape[1:])) if len(shape) > 1 else 1
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
            self._mm = (
                np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(n,)) if n else np.empty(0, dtype=dtype)
            )

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) (elements, for a 1-D member): a read-only view of the
        mapped file for stored members, an in-memory copy for compressed ones."""
        a, b = start * self.row_size, stop * self.row_size
        if self._mm is not None:
            out = self._mm[a:b].view(np.ndarray)  # read-only view of the mapped file
        else:
            item = self.dtype.itemsize
            try:
                if self._stream is None:
                    self._stream = self._zf.open(self._info)
                self._stream.seek(self._header_len + a * item)
                data = self._stream.read((b - a) * item)
            except _ZIP_ERRORS as exc:
                raise AuditInputError(
                    f"{self.path}: {self.name}: cannot read the compressed member ({type(exc).__name__}: {exc})"
                ) from exc
            if len(data) != (b - a) * item:
                raise AuditInputError(
                    f"{self.path}: {self.name}: truncated member ({len(data)} "
                    f"bytes where {(b - a) * item} were expected)"
                )
            out = np.frombuffer(data, dtype=self.dtype).copy()
        return out.reshape((stop - start,) + self.shape[1:]) if len(self.shape) > 1 else out

    def all(self) -> np.ndarray:
        return self.read(0, len(self))


class _Members:
    """The NPZ members by column name, each parsed on first use: a member the layout does
    not read (an object array, a malformed header) is never opened, so it cannot make the
    file fatal."""

    def __init__(self, path: str, zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo]) -> None:
        self.path, self._zf, self._infos = path, zf, infos
        self._open: dict[str, _NpzArray] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._infos

    def __iter__(self):
        return iter(self._infos)

    def __getitem__(self, name: str) -> _NpzArray:
        if name not in self._open:
            try:
                self._open[name] = _NpzArray(self.path, self._zf, self._infos[name])
            except AuditInputError:
                raise
            except _ZIP_ERRORS as exc:
                raise AuditInputError(
                    f"{self.path}: {name}: not a readable .npy member ({type(exc).__name__}: {exc})"
                ) from exc
        return self._open[name]


class NpzSource(Source):
    """An NPZ audit input: column directory, shapes and offsets checked at :meth:`bind`."""

    def __init__(self, path: str) -> None:
        self.path = str(path)
        try:
            self._zf = zipfile.ZipFile(self.path)
        except _ZIP_ERRORS as exc:
            raise AuditInputError(f"{self.path}: not a readable NPZ file ({exc})") from exc
        members = {i.filename[:-4]: i for i in self._zf.infolist() if i.filename.endswith(".npy")}
        self.arrays = _Members(self.path, self._zf, members)
        self.offsets: dict[str, np.ndarray] = {}
        self.resolved: Resolved | None = None
        self.num_sequences = 0

    def columns(self) -> list[str]:
        """The column names a layout can map (``C_offsets`` members belong to ``C``)."""
        return [k for k in self.arrays if not (k.endswith("_offsets") and k[: -len("_offsets")] in self.arrays)]

    def close(self) -> None:
        self._zf.close()

    def bind(self, resolved: Resolved) -> NpzSource:
        """Check the columns ``resolved`` reads (fatal errors name file, column, layout)."""
        self.resolved = resolved
        rows: dict[str, int] = {}
        id_col = resolved.id_column
        if id_col is not None:
            if id_col not in self.arrays:
                raise AuditInputError(f"{self.path}: missing column '{id_col}'")
            ids = self.arrays[id_col]
            if len(ids.shape) != 1:
                raise AuditInputError(f"{self.path}: {id_col} must be 1-D, got shape {ids.shape}")
            rows[id_col] = len(ids)
        for c, dst in resolved.wants():
            if c == id_col or c not in self.arrays:
                continue
            arr = self.arrays[c]
            if arr.dtype.kind == "c" or (arr.dtype.kind == "f" and arr.dtype.itemsize > 8):
                raise AuditInputError(
                    f"{self.path}: {c}: dtype {arr.dtype} is not supported (float16, float32 or float64)"
                )
            if ROLES[dst] == "row" and dst in COLUMN_KINDS and arr.dtype.kind not in COLUMN_KINDS[dst]:
                raise AuditInputError(f"{self.path}: {c}: values must be {kind_words(dst)}, got dtype {arr.dtype}")
            if ROLES[dst] in ("row", "value"):
                if len(arr.shape) != 1:
                    raise AuditInputError(
                        f"{self.path}: {c}: one value per sequence expected (1-D), got shape {arr.shape}"
                    )
                rows[c] = len(arr)
            elif f"{c}_offsets" in self.arrays:
                if len(arr.shape) != 1:
                    raise AuditInputError(
                        f"{self.path}: {c}: must be flat (1-D) with {c}_offsets, got shape {arr.shape}"
                    )
                off = self.arrays[f"{c}_offsets"].all()
                rows[c] = off.size - 1 if off.ndim == 1 else -1
                self.offsets[c] = off
            elif len(arr.shape) == 2:
                rows[c] = arr.shape[0]
            else:
                raise AuditInputError(
                    f"{self.path}: {c}: missing column '{c}_offsets' (a flat "
                    f"column needs offsets; a padded one is 2-D), got shape "
                    f"{arr.shape}"
                )
        if not rows:
            raise AuditInputError(f"{self.path}: none of the columns {resolved.layout.describe()} reads is in the file")
        first = next(iter(rows))
        self.num_sequences = rows[first] if id_col is None else rows[id_col]
        for c in rows:
            shape = self.arrays[c].shape
            if len(shape) == 2 and shape[1] > AUDIT_SEQUENCE_TOKENS:  # padded: its width
                raise AuditInputError(_too_long(self.path, c, "a padded row", shape[1]))
        for c, off in self.offsets.items():
            self.offsets[c] = _check_offsets(self.path, c, off, self.num_sequences, len(self.arrays[c]))
        for c, n in rows.items():
            if n != self.num_sequences and c not in self.offsets:
                raise AuditInputError(
                    f"{self.path}: column '{c}' has {n} rows, '{first}' has "
                    f"{self.num_sequences} ({resolved.layout.describe()})"
                )
        return self

    def _size_column(self) -> tuple[str | None, int]:
        """The response-side column that sizes chunks, and its width when padded (0)."""
        assert self.resolved is not None
        for dst in ("response_ids", "input_ids"):
            c = self.resolved.spec(dst)
            if c in self.offsets:
                return c, 0
            if c in self.arrays and len(self.arrays[c].shape) == 2:
                return None, self.arrays[c].shape[1]
        return None, 0

    def iter_chunks(
        self, start: int = 0, stop: int | None = None, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    ) -> Iterator[TableChunk]:
        """Chunks of sequences [start, stop) (0-based rows)."""
        stop = self.num_sequences if stop is None else stop
        size_col, width = self._size_column()
        i = start
        while i < stop:
            if size_col is not None:  # about chunk_tokens tokens per chunk
                off = self.offsets[size_col]
                j = int(np.searchsorted(off, off[i] + chunk_tokens, side="right")) - 1
                j = min(max(j, i + 1), stop)
            elif width:
                j = min(i + max(chunk_tokens // width, 1), stop)
            else:
                j = min(i + 4096, stop)
            yield self._chunk(i, j)
            i = j

    def _chunk(self, i: int, j: int) -> TableChunk:
        assert self.resolved is not None
        cols: dict = {}
        lines = np.arange(i, j, dtype=np.int64)
        flagged: dict = {}
        id_col = self.resolved.id_column
        if id_col is not None:
            cols[id_col] = PerRow(
                ids_column(self.arrays[id_col].read(i, j).tolist(), id_col, self.path, "row", lines, flagged)
            )
        for c, dst in self.resolved.wants():
            if c == id_col or c not in self.arrays:
                continue
            arr = self.arrays[c]
            if c in self.offsets:
                o = self.offsets[c][i : j + 1]
                cols[c] = Ragged(arr.read(int(o[0]), int(o[-1])), np.diff(o))
            elif ROLES[dst] == "value":
                cols[c] = PerRow(value_column(arr.read(i, j)))
            elif ROLES[dst] == "row":
                cols[c] = PerRow(arr.read(i, j).astype(np.int64))
            else:
                cols[c] = Padded(arr.read(i, j))
        return TableChunk(self.path, "row", lines, cols, flagged)


def _check_offsets(path: str, column: str, off: np.ndarray, nseq: int, nvalues: int) -> np.ndarray:
    name = f"{column}_offsets"
    if off.ndim != 1 or off.size != nseq + 1:
        raise AuditInputError(f"{path}: {name}: must have len(id) + 1 = {nseq + 1} entries, got shape {off.shape}")
    if off.dtype.kind not in "iu":
        raise AuditInputError(f"{path}: {name}: must be integers, got dtype {off.dtype}")
    off = off.astype(np.int64)
    if off[0] != 0:
        raise AuditInputError(f"{path}: {name}: must start at 0, got {off[0]}")
    bad = np.flatnonzero(np.diff(off) < 0)
    if bad.size:
        raise AuditInputError(
            f"{path}: {name}: ragged offsets, decreasing at row {bad[0]} ({off[bad[0]]} -> {off[bad[0] + 1]})"
        )
    if off[-1] != nvalues:
        raise AuditInputError(f"{path}: {name}: last offset {off[-1]} != number of values {nvalues} in '{column}'")
    lengths = np.diff(off)
    longest = int(lengths.argmax()) if lengths.size else 0
    if lengths.size and lengths[longest] > AUDIT_SEQUENCE_TOKENS:
        raise AuditInputError(_too_long(path, column, f"sequence {longest}", int(lengths[longest])))
    return off


def _too_long(path: str, column: str, which: str, n: int) -> str:
    return (
        f"{path}: {column}: {which} has {n:,} tokens, more than the {AUDIT_SEQUENCE_TOKENS:,} "
        f"a sequence may have (inputs are read per sequence; docs/audit.md, Limits)"
    )
