"""Golden file format: one scenario's outputs <-> ``manifest.json``, ``tokens.txt``,
``logprobs.txt`` and, when some row asks for them, ``top_logprobs.txt`` (schema version
1, see docs/golden.md).

Each text file has one entry per line, in the order the scenario produced them::

    tokens.txt        <token id> <request>@<position>
    logprobs.txt      0x<uint32 bits, 8 hex digits> <shortest float32 decimal> <request>@<position>
    top_logprobs.txt  <token id> 0x<uint32 bits> <decimal> <request>@<position>#<rank>

``top_logprobs.txt`` holds, for the entries of rows with ``logprobs = n > 0``, their n
top logprobs (rank 0 first); entries of other rows have none. The hex bits are
authoritative (so ``-0.0`` vs ``0.0`` and NaN payloads are visible); the decimal is for
humans and is checked against the bits on load. The manifest holds the dtypes (``<i8`` /
``<f4``), shapes and the sha256 of each array's raw little-endian bytes, which detects
any edit or truncation of the text files.

Everything here is a pure function of its inputs: serialising the same record twice
gives byte-identical text (sorted JSON keys, no timestamps).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from detsample.errors import DetsampleError
from detsample.inputs import GOLDEN_FILE_BYTES, InputError, loads, read_bounded

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
TOKENS = "tokens.txt"
LOGPROBS = "logprobs.txt"
TOP_LOGPROBS = "top_logprobs.txt"
FILES = (TOKENS, LOGPROBS, MANIFEST)  # always present
ALL_FILES = (TOKENS, LOGPROBS, TOP_LOGPROBS, MANIFEST)  # write order: manifest last
ARRAY_SPECS = {"tokens": (TOKENS, "<i8"), "logprobs": (LOGPROBS, "<f4")}
TOP_SPECS = {"top_ids": (TOP_LOGPROBS, "<i8"), "top_logprobs": (TOP_LOGPROBS, "<f4")}
_RID = re.compile(r"^[A-Za-z0-9_.:-]+$")


class GoldenFormatError(DetsampleError):
    """A golden file is malformed, inconsistent with its manifest, or of another schema."""


def read_golden(path: Path) -> bytes:
    """The bytes of one golden file: a regular file of at most ``GOLDEN_FILE_BYTES``
    (:mod:`detsample.inputs`: a FIFO would block, ``/dev/zero`` never end); anything else
    is a GoldenFormatError naming the file (FileNotFoundError passes through)."""
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(str(path))
    try:
        return read_bounded(path, GOLDEN_FILE_BYTES)
    except InputError as e:
        raise GoldenFormatError(str(e)) from None
    except OSError as e:
        raise GoldenFormatError(f"{path}: cannot be read ({e.strerror or e})") from None


#: the ``cpu_dispatch`` fields of a CPU manifest (how its goldens were produced): strings
DISPATCH_FIELDS = ("mode", "machine_isa", "mkl", "vml")


def dispatch_problem(manifest: Mapping[str, Any]) -> str | None:
    """Why a manifest's ``cpu_dispatch`` (when present) is malformed: not an object, or a
    field of :data:`DISPATCH_FIELDS` that is not a string; None when well formed."""
    d = manifest.get("cpu_dispatch")
    if d is None:
        return None
    if not isinstance(d, dict):
        return f"{MANIFEST}: cpu_dispatch must be an object, got {d!r:.60}"
    for k in DISPATCH_FIELDS:
        if k in d and not isinstance(d[k], str):
            return f"{MANIFEST}: cpu_dispatch.{k} must be a string, got {d[k]!r:.60}"
    return None


def text_of(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text; a byte that is not UTF-8 is a GoldenFormatError naming the
    file, the line and the column (golden files are untrusted input)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise GoldenFormatError(f"{where}:{line}: not UTF-8 (byte 0x{data[e.start]:02x} at column {col})") from None


def load_json(text: str, where: str) -> Any:
    """JSON text -> object; invalid JSON is a GoldenFormatError naming file and line."""
    try:
        return loads(text)
    except json.JSONDecodeError as e:
        raise GoldenFormatError(f"{where}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
    except ValueError as e:  # nested beyond the parser's limit
        raise GoldenFormatError(f"{where}: invalid JSON: {e}") from None


def file_reference_problem(key: str, named: Any, expected: str) -> str | None:
    """Why a manifest's ``file`` entry for ``key`` is not ``expected`` (a golden names
    only its own files, inside its own folder), or None."""
    if named == expected:
        return None
    if not isinstance(named, str) or not named:
        return f"{MANIFEST}: {key}.file must be {expected!r}, got {named!r}"
    if "/" in named or "\\" in named or named in (".", "..") or named.startswith("~"):
        return (
            f"{MANIFEST}: {key}.file {named!r} points outside the scenario folder (a "
            f"golden names only its own files: {expected!r})"
        )
    return f"{MANIFEST}: {key}.file names {named!r}; the format keeps it in {expected!r}"


@dataclass(frozen=True)
class ScenarioOutput:
    """What a scenario produced: N entries, each (request, position, token, logprob),
    and the top logprobs of the entries whose row asks for them.

    - ``rids``: N request ids (no whitespace, no ``@``);
    - ``positions``: [N] int64, the position the token was sampled at;
    - ``tokens``: [N] int64 sampled token ids;
    - ``logprobs``: [N] float32 sampling-time logprobs;
    - ``top_counts``: [N] int64, how many top logprobs entry i has (0 when its row asks
      for none; default all 0); ``top_ids`` [M] int64 and ``top_logprobs`` [M] float32,
      M = ``top_counts.sum()``, entry by entry, rank 0 first;
    - ``meta``: JSON-serialisable description (params, seeds, rng, inputs).
    """

    rids: tuple[str, ...]
    positions: np.ndarray
    tokens: np.ndarray
    logprobs: np.ndarray
    meta: Mapping[str, Any] = field(default_factory=dict)
    top_counts: np.ndarray | None = None
    top_ids: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rids", tuple(str(r) for r in self.rids))
        object.__setattr__(self, "positions", np.ascontiguousarray(self.positions, dtype="<i8"))
        if np.asarray(self.tokens).dtype.kind not in "iu":
            raise GoldenFormatError(f"tokens must be integers, got dtype {np.asarray(self.tokens).dtype}")
        if np.asarray(self.logprobs).dtype != np.float32:
            raise GoldenFormatError(f"logprobs must be float32, got dtype {np.asarray(self.logprobs).dtype}")
        object.__setattr__(self, "tokens", np.ascontiguousarray(self.tokens, dtype="<i8"))
        object.__setattr__(self, "logprobs", np.ascontiguousarray(self.logprobs, dtype="<f4"))
        n = len(self.rids)
        for name in ("positions", "tokens", "logprobs"):
            arr = getattr(self, name)
            if arr.shape != (n,):
                raise GoldenFormatError(f"{name} must have shape ({n},), got {arr.shape}")
        for r in set(self.rids):
            if not _RID.match(r) or "@" in r:
                raise GoldenFormatError(f"request ids must match {_RID.pattern}, got {r!r}")
        self._init_top(n)

    def _init_top(self, n: int) -> None:
        counts = np.zeros(n, "<i8") if self.top_counts is None else self.top_counts
        counts = np.ascontiguousarray(counts, dtype="<i8")
        if counts.shape != (n,) or (counts < 0).any():
            raise GoldenFormatError(f"top_counts must be {n} non-negative counts, got {counts!r}")
        m = int(counts.sum())
        ids = np.zeros(0, "<i8") if self.top_ids is None else self.top_ids
        if np.asarray(ids).dtype.kind not in "iu":
            raise GoldenFormatError(f"top_ids must be integers, got dtype {np.asarray(ids).dtype}")
        vals = np.zeros(0, "<f4") if self.top_logprobs is None else self.top_logprobs
        if np.asarray(vals).dtype != np.float32:
            raise GoldenFormatError(f"top_logprobs must be float32, got dtype {np.asarray(vals).dtype}")
        object.__setattr__(self, "top_counts", counts)
        object.__setattr__(self, "top_ids", np.ascontiguousarray(ids, dtype="<i8"))
        object.__setattr__(self, "top_logprobs", np.ascontiguousarray(vals, dtype="<f4"))
        for name in ("top_ids", "top_logprobs"):
            if getattr(self, name).shape != (m,):
                raise GoldenFormatError(
                    f"{name} must have shape ({m},) (the sum of top_counts), got {getattr(self, name).shape}"
                )

    @property
    def labels(self) -> list[str]:
        """``"<request>@<position>"`` per entry."""
        return [f"{r}@{int(p)}" for r, p in zip(self.rids, self.positions)]

    @property
    def top_offsets(self) -> np.ndarray:
        """[N + 1] int64: entry i's top logprobs are ``top_*[off[i]:off[i + 1]]``."""
        return np.concatenate([[0], np.cumsum(self.top_counts)]).astype(np.int64)

    def top_labels(self) -> list[str]:
        """``"<request>@<position>#<rank>"`` per top logprob."""
        return [f"{lab}#{k}" for lab, c in zip(self.labels, self.top_counts.tolist()) for k in range(c)]

    def take(self, indices: Sequence[int] | np.ndarray) -> ScenarioOutput:
        """The entries at ``indices`` (in that order), with their top logprobs, same meta."""
        idx = np.asarray(indices, dtype=np.int64)
        off = self.top_offsets
        sel = np.concatenate([np.arange(off[i], off[i + 1]) for i in idx.tolist()] or [np.zeros(0, np.int64)]).astype(
            np.int64
        )
        return ScenarioOutput(
            tuple(self.rids[i] for i in idx.tolist()),
            self.positions[idx],
            self.tokens[idx],
            self.logprobs[idx],
            self.meta,
            self.top_counts[idx],
            self.top_ids[sel],
            self.top_logprobs[sel],
        )

    def of_request(self, rid: str) -> ScenarioOutput:
        """The entries of request ``rid``, in order."""
        return self.take([i for i, r in enumerate(self.rids) if r == rid])

    def bits(self) -> np.ndarray:
        """[N] uint32 bit patterns of ``logprobs``."""
        return self.logprobs.view("<u4")


def sha256(arr: np.ndarray) -> str:
    """sha256 of the raw bytes of a little-endian contiguous array."""
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def float_text(bits: int) -> str:
    """Shortest decimal that round-trips to the float32 with these bits."""
    return str(np.array([bits], dtype="<u4").view("<f4")[0])


def encode_tokens(out: ScenarioOutput) -> str:
    return "".join(f"{int(t)} {lab}\n" for t, lab in zip(out.tokens, out.labels))


def encode_logprobs(out: ScenarioOutput) -> str:
    return "".join(f"0x{int(b):08x} {float_text(int(b))} {lab}\n" for b, lab in zip(out.bits(), out.labels))


def encode_top_logprobs(out: ScenarioOutput) -> str:
    return "".join(
        f"{int(t)} 0x{int(b):08x} {float_text(int(b))} {lab}\n"
        for t, b, lab in zip(out.top_ids, out.top_logprobs.view("<u4"), out.top_labels())
    )


def encode_manifest(out: ScenarioOutput, scenario: str, extra: Mapping[str, Any]) -> str:
    """The manifest text. ``extra`` holds platform and version facts."""
    n, m = len(out.rids), int(out.top_counts.sum())
    arrays = {}
    specs = {**ARRAY_SPECS, **(TOP_SPECS if m else {})}
    for name, (fname, dtype) in specs.items():
        arrays[name] = {
            "file": fname,
            "dtype": dtype,
            "shape": [m if name in TOP_SPECS else n],
            "sha256": sha256(getattr(out, name)),
        }
    doc = {
        "schema_version": SCHEMA_VERSION,
        "scenario": scenario,
        "arrays": arrays,
        "positions_sha256": sha256(out.positions),
        **dict(extra),
        **dict(out.meta),
    }
    if m:
        doc["top_counts_sha256"] = sha256(out.top_counts)
    return json.dumps(doc, sort_keys=True, indent=1, allow_nan=False) + "\n"


def encode(out: ScenarioOutput, scenario: str, extra: Mapping[str, Any]) -> dict[str, str]:
    """File name -> text of the golden files (``top_logprobs.txt`` only when an entry
    has top logprobs), in write order (manifest last)."""
    texts = {TOKENS: encode_tokens(out), LOGPROBS: encode_logprobs(out)}
    if int(out.top_counts.sum()):
        texts[TOP_LOGPROBS] = encode_top_logprobs(out)
    texts[MANIFEST] = encode_manifest(out, scenario, extra)
    return texts


def _split_label(lab: str, where: str) -> tuple[str, int]:
    rid, sep, pos = lab.rpartition("@")
    if not sep or not rid:
        raise GoldenFormatError(f"{where}: label must be <request>@<position>, got {lab!r}")
    try:
        return rid, int(pos)
    except ValueError:
        raise GoldenFormatError(f"{where}: position must be an integer, got {pos!r}") from None


def _parse_lines(text: str, fname: str, nfields: int) -> list[list[str]]:
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if len(parts) != nfields:
            raise GoldenFormatError(f"{fname}:{i}: expected {nfields} fields, got {line!r}")
        rows.append(parts)
    return rows


def decode(texts: Mapping[str, str]) -> tuple[ScenarioOutput, dict[str, Any]]:
    """Parse the three files back into a :class:`ScenarioOutput` and the manifest.

    Raises :class:`GoldenFormatError` when a file is malformed, the schema version is not
    ours, the two text files disagree on the labels, a decimal disagrees with its bits, or
    an array's sha256/shape/dtype differs from the manifest.
    """
    out, manifest, problems = decode_lenient(texts)
    if problems:
        raise GoldenFormatError(problems[0])
    return out, manifest


def decode_lenient(texts: Mapping[str, str]) -> tuple[ScenarioOutput, dict[str, Any], list[str]]:
    """Like :func:`decode`, but integrity problems (a decimal that disagrees with its bits,
    an array that disagrees with the manifest) are returned as messages instead of raised,
    so that a hand-edited golden can still be compared entry by entry. Syntax errors
    (unparseable files, other schema, mismatched labels) still raise."""
    manifest = load_json(texts[MANIFEST], MANIFEST)
    if not isinstance(manifest, dict) or manifest.get("schema_version") != SCHEMA_VERSION:
        got = manifest.get("schema_version") if isinstance(manifest, dict) else manifest
        raise GoldenFormatError(f"{MANIFEST}: schema_version must be {SCHEMA_VERSION}, got {got!r}")
    trows = _parse_lines(texts[TOKENS], TOKENS, 2)
    lrows = _parse_lines(texts[LOGPROBS], LOGPROBS, 3)
    if len(trows) != len(lrows):
        raise GoldenFormatError(f"{TOKENS} has {len(trows)} lines but {LOGPROBS} has {len(lrows)}")
    labels = [r[1] for r in trows]
    for i, (a, r) in enumerate(zip(labels, lrows), 1):
        if a != r[2]:
            raise GoldenFormatError(f"line {i}: {TOKENS} says {a!r} but {LOGPROBS} says {r[2]!r}")
    split = [_split_label(lab, f"{TOKENS}:{i}") for i, lab in enumerate(labels, 1)]
    tokens, bits32, problems = _ids_and_bits((TOKENS, LOGPROBS), [r[0] for r in trows], lrows, 0)
    counts, top_ids, top_bits, top_problems = _decode_top(texts.get(TOP_LOGPROBS, ""), labels)
    out = ScenarioOutput(
        rids=tuple(s[0] for s in split),
        positions=np.array([s[1] for s in split], dtype="<i8"),
        tokens=tokens,
        logprobs=bits32.view("<f4"),
        top_counts=counts,
        top_ids=top_ids,
        top_logprobs=top_bits.view("<f4"),
    )
    return out, manifest, problems + top_problems + _manifest_problems(out, manifest)


def _decode_top(text: str, labels: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """``top_logprobs.txt`` -> (counts [N], ids [M], uint32 bits [M], problems). Its lines
    must follow the entries' order with ranks 0, 1, ... per entry (else it raises)."""
    rows = _parse_lines(text, TOP_LOGPROBS, 4)
    where = {lab: i for i, lab in enumerate(labels)}
    counts = np.zeros(len(labels), dtype="<i8")
    last = -1
    problems = []
    for i, r in enumerate(rows, 1):
        lab, sep, rank = r[3].rpartition("#")
        entry = where.get(lab, -1) if sep else -1
        if entry < last or entry < 0 or rank != str(counts[entry]):
            raise GoldenFormatError(
                f"{TOP_LOGPROBS}:{i}: expected the next rank of an entry of {TOKENS}, in order, got {r[3]!r}"
            )
        last = entry
        counts[entry] += 1
    ids, bits32, problems = _ids_and_bits((TOP_LOGPROBS, TOP_LOGPROBS), [r[0] for r in rows], rows, 1)
    return counts, ids, bits32, problems


def _ints(fname: str, texts: list[str], base: int, dtype: str) -> np.ndarray:
    """Integer texts (one per line of ``fname``) -> an array of ``dtype``; a text that is
    not an integer, or does not fit, raises naming the file, the line and the text."""
    try:
        return np.array([int(t, base) for t in texts], dtype=dtype)
    except (ValueError, OverflowError):
        for i, t in enumerate(texts, 1):
            try:
                np.array([int(t, base)], dtype=dtype)
            except (ValueError, OverflowError) as e:
                raise GoldenFormatError(
                    f"{fname}:{i}: not an {np.dtype(dtype).name} in golden text: {t[:40]!r} ({e})"
                ) from None
        raise


def _ids_and_bits(
    fnames: tuple[str, str], ids: list[str], rows: list[list[str]], col: int
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Token ids (decimal text, from the file ``fnames[0]``) -> int64, and the float32
    bits of ``rows`` (of ``fnames[1]``: hex in column ``col``, its decimal in ``col + 1``)
    -> uint32, with a problem message per decimal that disagrees with its bits."""
    tok = _ints(fnames[0], ids, 10, "<i8")
    fname = fnames[1]
    bits = _ints(fname, [r[col] for r in rows], 16, "<u8")
    if bits.size and int(bits.max()) > 0xFFFFFFFF:
        raise GoldenFormatError(f"{fname}: bits must fit in uint32")
    bits32 = bits.astype("<u4")
    problems = [
        f"{fname}:{i}: decimal {r[col + 1]!r} disagrees with bits 0x{int(b):08x} (= {float_text(int(b))})"
        for i, (b, r) in enumerate(zip(bits32, rows), 1)
        if float_text(int(b)) != r[col + 1]
    ]
    return tok, bits32, problems


def _manifest_problems(out: ScenarioOutput, manifest: Mapping[str, Any]) -> list[str]:
    problems = [p for p in [dispatch_problem(manifest)] if p]
    arrays = manifest.get("arrays", {})
    for name, (fname, dtype) in ARRAY_SPECS.items():
        spec = arrays.get(name) if isinstance(arrays, dict) else None
        if not isinstance(spec, dict):
            problems.append(f"{MANIFEST}: missing arrays.{name}")
            continue
        arr = getattr(out, name)
        ref = file_reference_problem(f"arrays.{name}", spec.get("file"), fname)
        if ref:
            problems.append(ref)
        elif spec.get("dtype") != dtype:
            problems.append(f"{MANIFEST}: arrays.{name}.dtype must be {dtype!r}, got {spec.get('dtype')!r}")
        elif spec.get("shape") != list(arr.shape):
            problems.append(f"{fname}: shape {list(arr.shape)} but {MANIFEST} says {spec.get('shape')}")
        elif spec.get("sha256") != sha256(arr):
            problems.append(f"{fname}: sha256 of its values differs from {MANIFEST} (edited or truncated by hand?)")
    if manifest.get("positions_sha256") != sha256(out.positions):
        problems.append(f"{TOKENS}: positions differ from {MANIFEST}")
    m = int(out.top_counts.sum())
    for name, (fname, dtype) in TOP_SPECS.items():
        spec = arrays.get(name) if isinstance(arrays, dict) else None
        if spec is None:
            if m:
                problems.append(f"{fname}: present but {MANIFEST} has no arrays.{name}")
            continue
        arr = getattr(out, name)
        ref = file_reference_problem(f"arrays.{name}", spec.get("file"), fname) if isinstance(spec, dict) else None
        if ref:
            problems.append(ref)
        elif not isinstance(spec, dict) or spec.get("dtype") != dtype:
            problems.append(f"{MANIFEST}: arrays.{name} must have dtype {dtype!r}")
        elif spec.get("shape") != [m] or spec.get("sha256") != sha256(arr):
            problems.append(f"{fname}: {name} differ from {MANIFEST} (edited, truncated or missing?)")
    if m and manifest.get("top_counts_sha256") != sha256(out.top_counts):
        problems.append(f"{TOP_LOGPROBS}: entries or ranks differ from {MANIFEST}")
    return problems


def concat(outputs: Sequence[ScenarioOutput], meta: Mapping[str, Any] | None = None) -> ScenarioOutput:
    """Entries of several outputs, in order (used by multi-step scenarios)."""
    if not outputs:
        return ScenarioOutput((), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), meta or {})
    return ScenarioOutput(
        rids=tuple(r for o in outputs for r in o.rids),
        positions=np.concatenate([o.positions for o in outputs]),
        tokens=np.concatenate([o.tokens for o in outputs]),
        logprobs=np.concatenate([o.logprobs for o in outputs]),
        meta=dict(meta or {}),
        top_counts=np.concatenate([o.top_counts for o in outputs]),
        top_ids=np.concatenate([o.top_ids for o in outputs]),
        top_logprobs=np.concatenate([o.top_logprobs for o in outputs]),
    )
