"""Tensor goldens of one platform: verify and update, and the script API.

A kernel developer records what their own kernel produced, as a mapping of names to
torch tensors or numpy arrays (:mod:`detsample.golden.tensor_format`), under
``golden/<platform fingerprint>/tensors/<name>/``, and compares later runs on bits
(:mod:`detsample.golden.tensor_diff`). The rules are the scenario goldens' (docs/golden.md):

- a mismatch writes ``<file>.obtained`` beside the golden and reports what moved;
- an update writes every file atomically (temporary name, fsync, ``os.replace``,
  manifest last) and is refused when ``CI`` is set unless forced;
- a platform with no tensor golden at all is a loud skip, never a pass; one golden
  missing where others exist is a failure.

:func:`check_tensors` is the script form; the pytest fixture
(``golden.check_tensors``, :mod:`detsample.golden.pytest_plugin`) uses the same store.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from detsample.errors import GoldenMismatch
from detsample.golden import tensor_diff
from detsample.golden import tensor_format as tf
from detsample.golden.format import MANIFEST, GoldenFormatError, read_golden
from detsample.golden.store import (
    CORRUPT,
    ENV_ROOT,
    MISMATCH,
    MISSING_PLATFORM,
    MISSING_SCENARIO,
    OBTAINED_SUFFIX,
    OK,
    Change,
    ChangeKind,
    GoldenMissing,
    GoldenStore,
    GoldenUpdateRefused,
    Verification,
    atomic_write,
    kept_as_recorded,
    replace_all,
    update_refusal,
)

TENSORS = "tensors"
ENV_UPDATE = "DETSAMPLE_GOLDEN_UPDATE"
UPDATE_HINT = (
    "create them with `python -m pytest --golden-update <your test file>` (scripts: "
    f"`check_tensors(..., update=True)` or {ENV_UPDATE}=1), review `git diff golden/`, "
    "and commit them"
)


def device_of(tensors: Mapping[str, Any]) -> str:
    """The device kind whose fingerprint applies: ``cuda`` (the device of the first CUDA
    tensor) when any tensor is on a GPU, else ``cpu``."""
    for x in tensors.values() if isinstance(tensors, Mapping) else ():
        if isinstance(x, torch.Tensor) and x.device.type == "cuda":
            return str(x.device)
    return "cpu"


class TensorGoldens:
    """The tensor goldens of one platform: ``<root>/<store.tensor_fingerprint>/tensors``."""

    def __init__(self, store: GoldenStore) -> None:
        self.store = store

    @property
    def root(self) -> Path:
        return self.store.root / self.store.tensor_fingerprint / TENSORS

    def golden_dir(self, name: str) -> Path:
        return self.root / tf.check_name("golden name", name)

    def names(self) -> list[str]:
        """Names of the tensor goldens stored for this platform (sorted): the folders
        holding a golden file (one whose manifest was deleted still counts, and is corrupt)."""
        if not self.root.is_dir():
            return []
        return sorted(
            {
                p.parent.name
                for p in self.root.glob("*/*")
                if p.is_file() and not p.name.endswith(OBTAINED_SUFFIX) and p.suffix in (".txt", ".bin", ".json")
            }
        )

    def has_platform(self) -> bool:
        return bool(self.names())

    def missing_platform_message(self) -> str:
        return (
            f"NO TENSOR GOLDENS for platform {self.store.tensor_fingerprint!r} under {self.root} - "
            f"this is a skip, NOT a pass; {UPDATE_HINT}"
        )

    # -- reading ---------------------------------------------------------------------
    def _read(self, name: str) -> dict[str, bytes]:
        d = self.golden_dir(name)
        try:
            files = {MANIFEST: read_golden(d / MANIFEST)}
            for spec in tf.parse_manifest(files[MANIFEST])["tensors"].values():
                if (d / spec["file"]).exists():  # a plain name (tensor_format checks it)
                    files[spec["file"]] = read_golden(d / spec["file"])
        except OSError as e:
            raise GoldenFormatError(f"{d}: cannot be read ({e.strerror or e})") from None
        return files

    def load(self, name: str) -> tuple[dict[str, tf.StoredTensor], dict[str, Any]]:
        """The stored tensors and manifest of ``name``: GoldenMissing when absent,
        GoldenFormatError when malformed or inconsistent with the manifest."""
        tensors, manifest, problems = self._load_lenient(name)
        if problems:
            raise GoldenFormatError(problems[0])
        return tensors, manifest

    def _load_lenient(self, name: str) -> tuple[dict[str, tf.StoredTensor], dict[str, Any], list[str]]:
        d = self.golden_dir(name)
        if not (d / MANIFEST).exists():
            if name in self.names():  # a deleted manifest: broken, not absent
                raise GoldenFormatError(
                    f"{d / MANIFEST}: missing while the tensor files are "
                    f"present: restore it (`git checkout {d}`) or record "
                    f"the golden again"
                )
            raise GoldenMissing(f"no tensor golden {name!r} on platform {self.store.tensor_fingerprint!r}")
        tensors, manifest, problems = tf.decode(self._read(name))
        if manifest.get("name") != name:
            problems.insert(0, f"{MANIFEST}: name is {manifest.get('name')!r}, expected {name!r}")
        return tensors, manifest, problems

    # -- comparing -------------------------------------------------------------------
    def verify(self, name: str, tensors: Mapping[str, Any], write_obtained: bool = True) -> Verification:
        """Compare ``tensors`` with golden ``name`` on bits (ValueError for bad input)."""
        obtained = tf.from_mapping(tensors)
        tf.check_name("golden name", name)
        if not self.has_platform():
            return Verification(name, MISSING_PLATFORM, self.missing_platform_message())
        try:
            golden, _, problems = self._load_lenient(name)
        except GoldenMissing as e:
            return Verification(name, MISSING_SCENARIO, f"{e}; {UPDATE_HINT}")
        except GoldenFormatError as e:
            msg = f"{name}: tensor golden is corrupt: {e}"
            return Verification(name, CORRUPT, self._with_obtained(msg, name, obtained, write_obtained))
        diff = tensor_diff.compare(name, golden, obtained)
        if problems:
            msg = (
                f"{name}: tensor golden is corrupt: {problems[0]}"
                + "".join(f"\n  also: {p}" for p in problems[1:4])
                + "\n  compared element by element anyway: "
                + diff.report()
            )
            return Verification(name, CORRUPT, self._with_obtained(msg, name, obtained, write_obtained), diff)
        if diff.ok:
            self._remove_obtained(name)
            return Verification(name, OK, diff.summary(), diff)
        return Verification(name, MISMATCH, self._with_obtained(diff.report(), name, obtained, write_obtained), diff)

    def _with_obtained(self, msg: str, name: str, obtained: Mapping[str, tf.StoredTensor], write: bool) -> str:
        if not write:
            return msg
        d = self.golden_dir(name)
        d.mkdir(parents=True, exist_ok=True)
        for f, data in self.encode(name, obtained).items():
            atomic_write(d / (f + OBTAINED_SUFFIX), data)
        return msg + f"\n  obtained files written beside the golden: {d / ('*' + OBTAINED_SUFFIX)}"

    def _remove_obtained(self, name: str) -> None:
        for p in self.golden_dir(name).glob("*" + OBTAINED_SUFFIX):
            p.unlink(missing_ok=True)

    # -- writing ---------------------------------------------------------------------
    def encode(self, name: str, tensors: Mapping[str, tf.StoredTensor]) -> dict[str, bytes]:
        return tf.encode(name, tensors, self.store.manifest_extra())

    def update(self, name: str, tensors: Mapping[str, Any]) -> Change:
        """Write golden ``name`` atomically (manifest last), delete the files of tensors
        it no longer holds, and say what moved (new / moved / metadata / unchanged)."""
        obtained = tf.from_mapping(tensors)
        d = self.golden_dir(name)
        files = self.encode(name, obtained)
        ours = {p.name for p in d.glob("*") if p.suffix in (".txt", ".bin", ".json")} if d.is_dir() else set()
        kept = kept_as_recorded(name, d, files) if ours == set(files) else None
        if kept is not None:
            self._remove_obtained(name)
            return kept
        change = self._change(name, obtained)
        replace_all([(d, {f: files[f] for f in sorted(files, key=lambda f: f == MANIFEST)})])
        for f in ours - set(files):
            (d / f).unlink(missing_ok=True)
        self._remove_obtained(name)
        return change

    def _change(self, name: str, obtained: Mapping[str, tf.StoredTensor]) -> Change:
        try:
            old, _ = self.load(name)
        except GoldenMissing:
            n = sum(t.numel for t in obtained.values())
            return Change(name, ChangeKind.NEW, f"{name}: new golden ({len(obtained)} tensors, {n} elements)")
        except GoldenFormatError as e:
            return Change(name, ChangeKind.MOVED, f"{name}: replaced corrupt golden ({e})")
        diff = tensor_diff.compare(name, old, obtained)
        if diff.ok:
            return Change(name, ChangeKind.METADATA, f"{name}: bits unchanged, manifest metadata changed")
        return Change(name, ChangeKind.MOVED, diff.report())


def script_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Where :func:`check_tensors` keeps goldens: ``root``, else ``$DETSAMPLE_GOLDEN_DIR``,
    else ``golden/`` in the current directory (the user's project, not detsample's)."""
    if root is not None:
        return Path(root)
    return Path(os.environ.get(ENV_ROOT) or Path.cwd() / "golden")


def check_tensors(
    name: str,
    tensors: Mapping[str, Any],
    *,
    root: str | os.PathLike[str] | None = None,
    update: bool | None = None,
    force: bool = False,
    device: str | torch.device | None = None,
) -> Verification | Change:
    """Compare ``tensors`` (names -> torch tensors or numpy arrays) with golden ``name``
    of this platform, bit for bit; or record them when ``update``.

    ``update`` defaults to ``$DETSAMPLE_GOLDEN_UPDATE == "1"``; ``device`` (whose
    fingerprint applies) defaults to the GPU of the first CUDA tensor, else ``cpu``;
    ``root``: see :func:`script_root`. Returns the :class:`Verification` (status ok) or,
    when updating, the :class:`Change`. Raises :class:`~detsample.errors.GoldenMismatch`
    (an ``AssertionError``) with the readable report when bits differ or the golden is
    corrupt, :class:`GoldenMissing` when there is no golden to compare with,
    :class:`GoldenUpdateRefused` when updating under ``CI`` without ``force``, and
    ``ValueError`` for a bad name, a non-tensor or an unsupported dtype.
    """
    if update is None:
        update = os.environ.get(ENV_UPDATE) == "1"
    store = GoldenStore(script_root(root), device=device if device is not None else device_of(tensors))
    goldens = TensorGoldens(store)
    if update:
        why = update_refusal(force)
        if why:
            raise GoldenUpdateRefused(why)
        return goldens.update(name, tensors)
    v = goldens.verify(name, tensors)
    if v.status in (MISSING_PLATFORM, MISSING_SCENARIO):
        raise GoldenMissing(v.message)
    if not v.ok:
        raise GoldenMismatch(v.message)
    return v
