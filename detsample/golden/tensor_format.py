"""Tensor golden files: a mapping of names to tensors <-> one folder (docs/golden.md).

A tensor golden is what a kernel produced, stored bit for bit::

    golden/<platform>/tensors/<golden name>/manifest.json
                                           /<tensor>.txt   numel <= TEXT_MAX_ELEMENTS
                                           /<tensor>.bin   larger tensors

``<tensor>.txt`` is reviewable in a diff: a header ``# <tensor> <dtype> [shape]``, then
one element per line in C order, ``[i,j] 0x<bits> <decimal>`` (the hex is authoritative,
the decimal is for humans and is checked against it on load). ``<tensor>.bin`` is the
raw little-endian bit patterns. The manifest holds, per tensor, the dtype, shape, file,
encoding and the sha256 of the raw bits, so a hand edit or a truncation of either form
is detected. Everything here is a pure function of its inputs: encoding the same
tensors twice gives byte-identical files (sorted JSON keys, no timestamps).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from detsample.golden import bits as B
from detsample.golden.format import MANIFEST, SCHEMA_VERSION, GoldenFormatError, load_json, sha256, text_of

KIND = "tensors"
TEXT_MAX_ELEMENTS = 1024
TEXT, BINARY = "hex-text", "raw-le"
_EXT = {TEXT: ".txt", BINARY: ".bin"}
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def check_name(what: str, name: Any) -> str:
    """``name`` if it can be a file name (letters, digits, ``_ . -``), else ValueError."""
    if not isinstance(name, str) or not _NAME.match(name) or name.endswith((".obtained", ".tmp")):
        raise ValueError(f"{what} must match {_NAME.pattern} (a plain file name), got {name!r}")
    return name


@dataclass(frozen=True)
class StoredTensor:
    """One tensor as a golden holds it: ``dtype``, ``shape`` and ``bits`` ([numel] of
    ``dtype.storage``, C order, little-endian)."""

    dtype: B.DType
    shape: tuple[int, ...]
    bits: np.ndarray

    @property
    def numel(self) -> int:
        return int(self.bits.size)

    def index(self, flat: int) -> tuple[int, ...]:
        return tuple(int(i) for i in np.unravel_index(flat, self.shape)) if self.shape else ()

    def describe(self) -> str:
        return f"{self.dtype.name} {list(self.shape)}"


def _torch_bits(name: str, x: torch.Tensor) -> tuple[str, np.ndarray]:
    if x.layout != torch.strided:
        raise ValueError(f"tensor {name!r} must be a dense (strided) tensor, got layout {x.layout}")
    dt = str(x.dtype).removeprefix("torch.")
    x = x.detach().cpu().contiguous()
    if dt == "bfloat16":
        return dt, x.view(torch.int16).numpy()
    if dt == "bool":
        return dt, x.view(torch.uint8).numpy()
    if dt not in B.DTYPES:
        raise ValueError(f"tensor {name!r} has dtype {x.dtype}; supported: {', '.join(B.DTYPES)}")
    return dt, x.resolve_conj().resolve_neg().numpy()


def from_array(name: str, x: Any) -> StoredTensor:
    """A torch tensor or numpy array (any device, layout order or byte order) as a
    :class:`StoredTensor`; ValueError for another type or an unsupported dtype."""
    check_name("tensor name", name)
    if isinstance(x, torch.Tensor):
        dt, arr = _torch_bits(name, x)
    elif isinstance(x, (np.ndarray, np.generic)):
        arr = np.asarray(x)
        dt = arr.dtype.name
        if dt not in B.DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {arr.dtype}; supported: {', '.join(B.DTYPES)}")
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    else:
        raise ValueError(f"tensor {name!r} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    d = B.DTYPES[dt]
    flat = np.ascontiguousarray(arr).reshape(-1).view(f"<u{d.width // 8}")
    if d.kind == "bool":
        flat = (flat != 0).astype("<u1")
    return StoredTensor(d, tuple(int(s) for s in arr.shape), np.ascontiguousarray(flat, d.storage))


def from_mapping(tensors: Mapping[str, Any]) -> dict[str, StoredTensor]:
    """Every entry of ``tensors`` through :func:`from_array` (ValueError when empty, not
    a mapping, or when two names differ only in case: they would share a file on some
    file systems)."""
    if not isinstance(tensors, Mapping):
        raise ValueError(f"tensors must be a mapping of names to tensors, got {type(tensors).__name__}")
    if not tensors:
        raise ValueError("tensors must name at least one tensor, got an empty mapping")
    out = {name: from_array(name, x) for name, x in tensors.items()}
    lower: dict[str, str] = {}
    for n in out:
        if n.lower() in lower:
            raise ValueError(f"tensor names must differ in more than case, got {lower[n.lower()]!r} and {n!r}")
        lower[n.lower()] = n
    return out


def encoding_of(t: StoredTensor, text_max: int = TEXT_MAX_ELEMENTS) -> str:
    return TEXT if t.numel <= text_max else BINARY


def _index_text(idx: tuple[int, ...]) -> str:
    return "[" + ",".join(str(i) for i in idx) + "]"


def element_text(t: StoredTensor, flat: int) -> str:
    """``[i,j] 0x<bits> <decimal>`` of element ``flat``."""
    b = int(t.bits[flat])
    return f"{_index_text(t.index(flat))} {B.hex_text(b, t.dtype)} {B.value_text(b, t.dtype)}"


def _header(name: str, t: StoredTensor) -> str:
    return f"# {name} {t.dtype.name} {_index_text(t.shape)}\n"


def encode_text(name: str, t: StoredTensor) -> str:
    return _header(name, t) + "".join(element_text(t, i) + "\n" for i in range(t.numel))


def encode(
    name: str, tensors: Mapping[str, StoredTensor], extra: Mapping[str, Any], text_max: int = TEXT_MAX_ELEMENTS
) -> dict[str, bytes]:
    """File name -> bytes of the golden ``name`` holding ``tensors`` (manifest included);
    ``extra`` holds platform and version facts."""
    files: dict[str, bytes] = {}
    specs = {}
    for tn in sorted(tensors):
        t = tensors[tn]
        enc = encoding_of(t, text_max)
        fname = tn + _EXT[enc]
        files[fname] = encode_text(tn, t).encode("utf-8") if enc == TEXT else t.bits.tobytes()
        specs[tn] = {
            "dtype": t.dtype.name,
            "shape": list(t.shape),
            "file": fname,
            "encoding": enc,
            "sha256": sha256(t.bits),
        }
    doc = {"schema_version": SCHEMA_VERSION, "kind": KIND, "name": name, "tensors": specs, **dict(extra)}
    files[MANIFEST] = (json.dumps(doc, sort_keys=True, indent=1, allow_nan=False) + "\n").encode("utf-8")
    return files


def parse_manifest(data: bytes) -> dict[str, Any]:
    """The manifest of a tensor golden, its structure checked (GoldenFormatError)."""
    doc = load_json(text_of(data, MANIFEST), MANIFEST)
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION or doc.get("kind") != KIND:
        raise GoldenFormatError(
            f"{MANIFEST}: must be a tensor golden of schema_version {SCHEMA_VERSION} (kind {KIND!r})"
        )
    specs = doc.get("tensors")
    if not isinstance(specs, dict) or not specs:
        raise GoldenFormatError(f"{MANIFEST}: 'tensors' must map names to specs, got {specs!r}")
    for tn, spec in specs.items():
        check = _spec_problem(tn, spec)
        if check:
            raise GoldenFormatError(f"{MANIFEST}: tensors.{tn}: {check}")
    return doc


def _spec_problem(tn: str, spec: Any) -> str | None:
    if not isinstance(spec, dict):
        return "must be an object"
    try:
        check_name("tensor name", tn)
        B.dtype(spec.get("dtype"))
    except ValueError as e:
        return str(e)
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        return f"shape must be a list of non-negative integers, got {shape!r}"
    enc = spec.get("encoding")
    if enc not in _EXT:
        return f"encoding must be one of {sorted(_EXT)}, got {enc!r}"
    if spec.get("file") != tn + _EXT[enc]:
        return f"file must be {tn + _EXT[enc]!r}, got {spec.get('file')!r}"
    return None


def _decode_text(tn: str, data: bytes, dt: B.DType, shape: tuple[int, ...]) -> tuple[np.ndarray, list[str]]:
    fname = tn + _EXT[TEXT]
    lines = text_of(data, fname).splitlines()
    head = _header(tn, StoredTensor(dt, shape, np.zeros(0, dt.storage))).rstrip("\n")
    if not lines or lines[0] != head:
        raise GoldenFormatError(f"{fname}:1: header must be {head!r}, got {(lines or [''])[0]!r}")
    rows = lines[1:]
    numel = int(np.prod(shape, dtype=np.int64))
    if len(rows) != numel:
        raise GoldenFormatError(f"{fname}: {len(rows)} elements, but shape {list(shape)} has {numel}")
    tmp = StoredTensor(dt, shape, np.zeros(numel, dt.storage))
    out = np.zeros(numel, dtype=np.uint64)
    problems = []
    for i, line in enumerate(rows):
        parts = line.split()
        if len(parts) != 3 or parts[0] != _index_text(tmp.index(i)):
            raise GoldenFormatError(
                f"{fname}:{i + 2}: expected '{_index_text(tmp.index(i))} 0x<bits> <decimal>', got {line!r}"
            )
        try:
            b = int(parts[1], 16)
        except ValueError:
            raise GoldenFormatError(f"{fname}:{i + 2}: bits must be hex, got {parts[1]!r}") from None
        if not parts[1].startswith("0x") or b >> dt.width:
            raise GoldenFormatError(
                f"{fname}:{i + 2}: bits must be 0x and {dt.hex_digits} hex digits, got {parts[1]!r}"
            )
        out[i] = b
        if B.value_text(b, dt) != parts[2]:
            problems.append(
                f"{fname}:{i + 2}: decimal {parts[2]!r} disagrees with bits {parts[1]} (= {B.value_text(b, dt)})"
            )
    return out.astype(dt.storage), problems


def decode(files: Mapping[str, bytes]) -> tuple[dict[str, StoredTensor], dict[str, Any], list[str]]:
    """Parse a tensor golden's files back: ``(tensors, manifest, problems)``.

    Structural errors (bad JSON, another schema, a missing file, a line out of place,
    a wrong element count) raise :class:`GoldenFormatError`; integrity problems (a
    decimal that disagrees with its bits, a sha256 or byte length that disagrees with
    the manifest) are returned as messages, so a hand-edited golden can still be
    compared element by element.
    """
    doc = parse_manifest(files[MANIFEST])
    out: dict[str, StoredTensor] = {}
    problems: list[str] = []
    for tn, spec in sorted(doc["tensors"].items()):
        dt, shape = B.dtype(spec["dtype"]), tuple(spec["shape"])
        if spec["file"] not in files:
            raise GoldenFormatError(f"{spec['file']}: missing (named by {MANIFEST})")
        data = files[spec["file"]]
        if spec["encoding"] == TEXT:
            bits, probs = _decode_text(tn, data, dt, shape)
            problems += probs
        else:
            numel = int(np.prod(shape, dtype=np.int64))
            if len(data) != numel * dt.width // 8:
                raise GoldenFormatError(
                    f"{spec['file']}: {len(data)} bytes, but {dt.name} {list(shape)} needs {numel * dt.width // 8}"
                )
            bits = np.frombuffer(data, dtype=dt.storage).copy()
        if sha256(bits) != spec.get("sha256"):
            problems.append(
                f"{spec['file']}: sha256 of its bits differs from {MANIFEST} (edited or truncated by hand?)"
            )
        out[tn] = StoredTensor(dt, shape, bits)
    return out, doc, problems
