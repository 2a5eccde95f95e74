"""pytest plugin (entry point ``pytest11``): the ``--golden-update`` workflow.

- ``pytest --golden-update`` regenerates the golden files of this platform (each file
  written to a temporary name and renamed; see docs/golden.md) instead of comparing,
  and prints what moved at the end of the session. It refuses to run when the ``CI``
  environment variable is set, unless ``--golden-force`` is given.
- ``--golden-dir PATH`` reads/writes goldens under PATH (default:
  ``$DETSAMPLE_GOLDEN_DIR``, else ``golden/`` under the pytest rootdir).
- ``--golden-isa all`` (or a list such as ``default,avx2``) runs the whole session once
  per CPU instruction set this machine supports, each in a child pytest under
  ``ATEN_CPU_CAPABILITY`` (:mod:`detsample.golden.isa`). With ``--golden-update`` the
  first set records the goldens; the others record their own tensor goldens (a user's
  kernels: one folder per set) but only verify the scenario goldens, which every set
  shares (``golden/cpu``: the sampler's bits are detsample's, not the set's), so a set
  that disagrees fails instead of overwriting them.
- The ``golden`` fixture: ``golden.check(name, output)`` compares a
  :class:`~detsample.golden.format.ScenarioOutput` with its golden on bits, and
  ``golden.check_tensors(name, {tensor name: tensor})`` does the same for any tensors a
  kernel produced (:mod:`detsample.golden.tensor_store`); both ``pytest.fail`` with the
  readable report on a mismatch, or record in update mode. A platform without goldens
  is a loud skip naming the command that creates them, never a pass.
- ``golden_update`` fixture: the flag, for tests that need it.

The plugin does nothing unless a test uses these fixtures or the options are given.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

_KEY = pytest.StashKey["GoldenSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("detsample")
    group.addoption(
        "--golden-update",
        action="store_true",
        default=False,
        help="regenerate detsample golden files for this platform",
    )
    group.addoption(
        "--golden-force", action="store_true", default=False, help="allow --golden-update when the CI variable is set"
    )
    group.addoption(
        "--golden-dir",
        default=None,
        metavar="PATH",
        help="root of the golden files (default: $DETSAMPLE_GOLDEN_DIR, else golden/ under the pytest rootdir)",
    )
    group.addoption(
        "--golden-verify-shared", action="store_true", default=False, help=argparse.SUPPRESS
    )  # --golden-isa's later sets: see the docstring
    group.addoption(
        "--golden-isa",
        default="current",
        metavar="ISA",
        help="run the session once per CPU instruction set, each in a subprocess "
        "under ATEN_CPU_CAPABILITY: 'all' (every set this CPU supports), "
        "a comma-separated list (default,avx2,avx512), or 'current' (default)",
    )


def _refuse(config: pytest.Config) -> None:
    """UsageError for ``--golden-update`` under CI (unless forced) or a bad ``--golden-isa``."""
    if config.getoption("--golden-update"):
        from detsample.golden.store import update_refusal

        why = update_refusal(force=bool(config.getoption("--golden-force")))
        if why:
            raise pytest.UsageError("--golden-update " + why)
    spec = config.getoption("--golden-isa")
    if spec != "current":
        from detsample.golden import isa

        try:
            isa.resolve(spec)
        except ValueError as e:
            raise pytest.UsageError(f"--golden-isa: {e}") from None


def pytest_configure(config: pytest.Config) -> None:
    _refuse(config)


def _without_isa(args: tuple[str, ...]) -> list[str]:
    """The session's arguments without ``--golden-isa X`` / ``--golden-isa=X``."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--golden-isa":
            skip = True
        elif not a.startswith("--golden-isa="):
            out.append(a)
    return out


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """``--golden-isa all|<list>``: run this session once per instruction set, each in a
    child pytest under ``ATEN_CPU_CAPABILITY``; the exit status is the worst child's."""
    spec = config.getoption("--golden-isa")
    if spec == "current":
        return None
    _refuse(config)
    from detsample.golden import isa

    argv = [sys.executable, "-m", "pytest", *_without_isa(config.invocation_params.args)]

    def echo(line: str) -> None:
        print(line, flush=True)

    then = argv + ["--golden-verify-shared"] if config.getoption("--golden-update") else None
    results = isa.run_per_isa(isa.resolve(spec), argv, echo, cwd=str(config.invocation_params.dir), then=then)
    return next((rc for _, rc in results if rc != 0), 0)


@dataclass
class GoldenSession:
    """Per-session golden state: the stores (one per device), the mode, what happened."""

    update: bool
    root: str | os.PathLike[str] | None
    verify_shared: bool = False  # under --golden-update: verify scenario goldens anyway
    changes: list[Any] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    _stores: dict[str, Any] = field(default_factory=dict)

    def store_for(self, device: str = "cpu") -> Any:
        if device not in self._stores:
            from detsample.golden.store import GoldenStore

            self._stores[device] = GoldenStore(self.root, device=device)
        return self._stores[device]

    @property
    def store(self) -> Any:
        return self.store_for("cpu")

    def _outcome(self, v: Any) -> None:
        if v.skipped:
            self.skipped.append(v.message)
            pytest.skip(v.message)
        if not v.ok:
            pytest.fail(v.message, pytrace=False)

    def check(self, name: str, output: Any) -> None:
        """Compare ``output`` (a ScenarioOutput) with golden ``name`` (or record it in
        update mode)."""
        if self.update and not self.verify_shared:
            self.changes.extend(self.store.update({name: output}))
            return
        self._outcome(self.store.verify(name, output))

    def check_tensors(self, name: str, tensors: Mapping[str, Any], device: Any = None) -> None:
        """Compare ``tensors`` (names -> torch tensors or numpy arrays) with tensor golden
        ``name`` of this platform on bits (or record them in update mode). ``device``
        (whose fingerprint applies) defaults to the GPU of the first CUDA tensor, else cpu."""
        from detsample.golden.tensor_store import TensorGoldens, device_of

        goldens = TensorGoldens(self.store_for(str(device) if device is not None else device_of(tensors)))
        if self.update:
            self.changes.append(goldens.update(name, tensors))
            return
        self._outcome(goldens.verify(name, tensors))


def _root(config: pytest.Config) -> str | os.PathLike[str]:
    from detsample.golden.store import ENV_ROOT

    return config.getoption("--golden-dir") or os.environ.get(ENV_ROOT) or Path(config.rootpath) / "golden"


def _session(config: pytest.Config) -> GoldenSession:
    if _KEY not in config.stash:
        config.stash[_KEY] = GoldenSession(
            update=bool(config.getoption("--golden-update")),
            root=_root(config),
            verify_shared=bool(config.getoption("--golden-verify-shared")),
        )
    return config.stash[_KEY]


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> GoldenSession:
    return _session(request.config)


@pytest.fixture
def golden_update(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--golden-update"))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    gs = config.stash.get(_KEY, None)
    if gs is None:
        return
    tr = terminalreporter
    if gs.update:
        from detsample.golden.store import ChangeKind

        moved = [c for c in gs.changes if c.kind is not ChangeKind.UNCHANGED]
        tr.write_sep("=", f"detsample golden update: {gs.store.platform_dir}")
        tr.write_line(
            f"{len(gs.changes)} goldens written, {len(moved)} changed, {len(gs.changes) - len(moved)} unchanged"
        )
        for c in moved:
            tr.write_line(f"[{c.kind}] {c.report}")
        if moved:
            tr.write_line("review with `git diff golden/` and commit the changes")
    if gs.skipped:
        tr.write_sep("!", "detsample goldens MISSING for this platform", red=True, bold=True)
        tr.write_line(f"{len(gs.skipped)} golden comparisons were SKIPPED, NOT passed:", red=True)
        for msg in dict.fromkeys(gs.skipped):
            tr.write_line("  " + msg, red=True)
