"""Golden files: per-platform, per-scenario recorded outputs, compared bit for bit.

Layout (docs/golden.md)::

    golden/<platform fingerprint>/<scenario>/manifest.json
                                            /tokens.txt
                                            /logprobs.txt

:class:`GoldenStore` is the facade: ``verify`` compares an obtained
:class:`~detsample.goldenfmt.ScenarioOutput` with the stored one (bits; on mismatch it
writes ``*.obtained`` files beside the golden), ``update`` rewrites goldens atomically
(every file goes to a temporary name first, then ``os.replace``; an interrupted update
leaves the old files intact), and a platform without goldens is reported as
``missing-platform`` with the commands that create them, never as a pass.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from detsample.errors import DetsampleError
from detsample.fingerprint import platform_fingerprint, platform_info
from detsample.goldendiff import GoldenDiff, compare
from detsample.goldenfmt import (FILES, MANIFEST, GoldenFormatError, ScenarioOutput,
                                 decode, encode)

ENV_ROOT = "DETSAMPLE_GOLDEN_DIR"
OBTAINED_SUFFIX = ".obtained"
UPDATE_HINT = ("create them on this machine with `python -m pytest --golden-update "
               "tests/test_golden_scenarios.py` (or `detsample golden update`), review "
               "`git diff golden/`, and commit the new folder")

# Verification statuses.
OK = "ok"
MISMATCH = "mismatch"
MISSING_PLATFORM = "missing-platform"
MISSING_SCENARIO = "missing-scenario"
CORRUPT = "corrupt"


class GoldenMissing(DetsampleError):
    """No golden exists for this platform or scenario."""


def golden_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Where goldens live: ``root``, else ``$DETSAMPLE_GOLDEN_DIR``, else the ``golden/``
    folder next to the ``detsample`` package (the repository's)."""
    if root is not None:
        return Path(root)
    env = os.environ.get(ENV_ROOT)
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "golden"


@dataclass(frozen=True)
class Verification:
    """Outcome of comparing one scenario: ``status`` is one of ok / mismatch /
    missing-platform / missing-scenario / corrupt; ``message`` is the readable report."""

    scenario: str
    status: str
    message: str
    diff: GoldenDiff | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def skipped(self) -> bool:
        return self.status == MISSING_PLATFORM


@dataclass(frozen=True)
class Change:
    """What an update did to one scenario: new / moved / unchanged (+ the diff report)."""

    scenario: str
    kind: str
    report: str


class GoldenStore:
    """The goldens of one platform under ``root`` (see :func:`golden_root`)."""

    def __init__(self, root: str | os.PathLike[str] | None = None,
                 fingerprint: str | None = None, device: str | torch.device = "cpu") -> None:
        self.root = golden_root(root)
        self.device = torch.device(device)
        self.fingerprint = fingerprint or platform_fingerprint(self.device)

    # -- paths -----------------------------------------------------------------------
    @property
    def platform_dir(self) -> Path:
        return self.root / self.fingerprint

    def scenario_dir(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"scenario name must be a plain folder name, got {name!r}")
        return self.platform_dir / name

    def has_platform(self) -> bool:
        """True when this platform has at least one golden scenario."""
        return self.platform_dir.is_dir() and any(self.platform_dir.glob(f"*/{MANIFEST}"))

    def scenarios(self) -> list[str]:
        """Names of the scenarios stored for this platform (sorted)."""
        if not self.platform_dir.is_dir():
            return []
        return sorted(p.parent.name for p in self.platform_dir.glob(f"*/{MANIFEST}"))

    def missing_platform_message(self) -> str:
        return (f"NO GOLDEN FILES for platform {self.fingerprint!r} under {self.root} - "
                f"this is a skip, NOT a pass; {UPDATE_HINT}")

    # -- reading ---------------------------------------------------------------------
    def load(self, name: str) -> tuple[ScenarioOutput, dict[str, Any]]:
        """The stored output and manifest of ``name``.

        Raises :class:`GoldenMissing` when absent, :class:`GoldenFormatError` when the
        files are malformed or disagree with the manifest.
        """
        d = self.scenario_dir(name)
        if not (d / MANIFEST).is_file():
            raise GoldenMissing(f"no golden for scenario {name!r} on platform {self.fingerprint!r}")
        texts = {}
        for f in FILES:
            try:
                texts[f] = (d / f).read_text(encoding="utf-8")
            except FileNotFoundError:
                raise GoldenFormatError(f"{d / f}: missing (manifest present)") from None
        out, manifest = decode(texts)
        if manifest.get("scenario") != name:
            raise GoldenFormatError(f"{d / MANIFEST}: scenario is {manifest.get('scenario')!r}, "
                                    f"expected {name!r}")
        return out, manifest

    def verify(self, name: str, obtained: ScenarioOutput, write_obtained: bool = True) -> Verification:
        """Compare ``obtained`` with the golden on bits; on a mismatch write the
        ``*.obtained`` files beside the golden (when ``write_obtained``)."""
        if not self.has_platform():
            return Verification(name, MISSING_PLATFORM, self.missing_platform_message())
        try:
            golden, _ = self.load(name)
        except GoldenMissing as e:
            return Verification(name, MISSING_SCENARIO, f"{e}; {UPDATE_HINT}")
        except GoldenFormatError as e:
            return Verification(name, CORRUPT, f"{name}: golden files are corrupt: {e}")
        diff = compare(name, golden, obtained)
        if diff.ok:
            self._remove_obtained(name)
            return Verification(name, OK, diff.summary(), diff)
        msg = diff.report()
        if write_obtained:
            written = self._write_obtained(name, obtained)
            msg += f"\n  obtained files written beside the golden: {written}"
        return Verification(name, MISMATCH, msg, diff)

    # -- writing ---------------------------------------------------------------------
    def manifest_extra(self) -> dict[str, Any]:
        from detsample import __version__
        return {"platform": self.fingerprint, "platform_info": platform_info(self.device),
                "library_version": __version__}

    def _texts(self, name: str, out: ScenarioOutput) -> dict[str, str]:
        return encode(out, name, self.manifest_extra())

    def _write_obtained(self, name: str, out: ScenarioOutput) -> str:
        d = self.scenario_dir(name)
        d.mkdir(parents=True, exist_ok=True)
        for f, text in self._texts(name, out).items():
            _atomic_write(d / (f + OBTAINED_SUFFIX), text)
        return str(d / ("*" + OBTAINED_SUFFIX))

    def _remove_obtained(self, name: str) -> None:
        d = self.scenario_dir(name)
        for f in FILES:
            (d / (f + OBTAINED_SUFFIX)).unlink(missing_ok=True)

    def update(self, outputs: Mapping[str, ScenarioOutput]) -> list[Change]:
        """Write the goldens of ``outputs`` for this platform, atomically per file.

        All texts are encoded first, then every changed file is written to a temporary
        name in its folder, then each is moved into place with ``os.replace`` (manifest
        last). If anything fails before the moves, no golden changes; temporary files are
        removed. Unchanged files are not rewritten. Returns what moved per scenario.
        """
        plans: list[tuple[str, dict[str, str], Change]] = []
        for name in sorted(outputs):
            texts = self._texts(name, outputs[name])
            plans.append((name, texts, self._change(name, outputs[name], texts)))
        staged: list[tuple[Path, Path]] = []
        try:
            for name, texts, change in plans:
                if change.kind == "unchanged":
                    continue
                d = self.scenario_dir(name)
                d.mkdir(parents=True, exist_ok=True)
                for f in FILES:  # manifest last
                    staged.append((_stage(d, f, texts[f]), d / f))
            for tmp, final in staged:
                os.replace(tmp, final)
        finally:
            for tmp, _ in staged:
                tmp.unlink(missing_ok=True)
        for name, _, _ in plans:
            self._remove_obtained(name)
        return [c for _, _, c in plans]

    def _change(self, name: str, out: ScenarioOutput, texts: Mapping[str, str]) -> Change:
        d = self.scenario_dir(name)
        if all((d / f).is_file() and (d / f).read_text(encoding="utf-8") == texts[f] for f in FILES):
            return Change(name, "unchanged", f"{name}: unchanged")
        try:
            old, _ = self.load(name)
        except GoldenMissing:
            return Change(name, "new", f"{name}: new golden ({len(out.rids)} entries)")
        except GoldenFormatError as e:
            return Change(name, "moved", f"{name}: replaced corrupt golden ({e})")
        diff = compare(name, old, out)
        if diff.ok:
            return Change(name, "metadata", f"{name}: bits unchanged, manifest metadata changed")
        return Change(name, "moved", diff.report())

    def stale(self, names: set[str] | list[str]) -> list[str]:
        """Stored scenarios that are no longer registered."""
        return [n for n in self.scenarios() if n not in set(names)]


def _stage(folder: Path, fname: str, text: str) -> Path:
    """Write ``text`` to a fresh temporary file in ``folder`` (fsynced); return its path."""
    fd, tmp = tempfile.mkstemp(prefix=f".{fname}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would make goldens private to one user
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _atomic_write(path: Path, text: str) -> None:
    tmp = _stage(path.parent, path.name, text)
    try:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
