"""pytest plugin (entry point ``pytest11``): the ``--golden-update`` workflow.

- ``pytest --golden-update`` regenerates the golden files of this platform (each file
  written to a temporary name and renamed; see docs/golden.md) instead of comparing,
  and prints what moved at the end of the session. It refuses to run when the ``CI``
  environment variable is set, unless ``--golden-force`` is given.
- ``--golden-dir PATH`` reads/writes goldens under PATH (default: the repository's
  ``golden/``; also ``$DETSAMPLE_GOLDEN_DIR``).
- The ``golden`` fixture: ``golden.check(name, output)`` compares a
  :class:`~detsample.golden.format.ScenarioOutput` with its golden on bits (``pytest.fail``
  with the readable report on a mismatch), or records it in update mode. A platform
  without goldens is a loud skip naming the command that creates them, never a pass.
- ``golden_update`` fixture: the flag, for tests that need it.

The plugin does nothing unless a test uses these fixtures or the options are given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

_KEY = pytest.StashKey["GoldenSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("detsample")
    group.addoption("--golden-update", action="store_true", default=False,
                    help="regenerate detsample golden files for this platform")
    group.addoption("--golden-force", action="store_true", default=False,
                    help="allow --golden-update when the CI variable is set")
    group.addoption("--golden-dir", default=None, metavar="PATH",
                    help="root of the detsample golden files (default: the repository's golden/)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--golden-update"):
        from detsample.golden.store import update_refusal
        why = update_refusal(force=bool(config.getoption("--golden-force")))
        if why:
            raise pytest.UsageError("--golden-update " + why)


@dataclass
class GoldenSession:
    """Per-session golden state: the store, the mode, and what happened."""

    update: bool
    root: str | None
    changes: list[Any] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    _store: Any = None

    @property
    def store(self) -> Any:
        if self._store is None:
            from detsample.golden.store import GoldenStore
            self._store = GoldenStore(self.root)
        return self._store

    def check(self, name: str, output: Any) -> None:
        """Compare ``output`` with golden ``name`` (or record it in update mode)."""
        if self.update:
            self.changes.extend(self.store.update({name: output}))
            return
        v = self.store.verify(name, output)
        if v.skipped:
            self.skipped.append(name)
            pytest.skip(v.message)
        if not v.ok:
            pytest.fail(v.message, pytrace=False)


def _session(config: pytest.Config) -> GoldenSession:
    if _KEY not in config.stash:
        config.stash[_KEY] = GoldenSession(update=bool(config.getoption("--golden-update")),
                                           root=config.getoption("--golden-dir"))
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
        tr.write_line(f"{len(gs.changes)} scenarios written, {len(moved)} changed, "
                      f"{len(gs.changes) - len(moved)} unchanged")
        for c in moved:
            tr.write_line(f"[{c.kind}] {c.report}")
        if moved:
            tr.write_line("review with `git diff golden/` and commit the changes")
    if gs.skipped:
        tr.write_sep("!", "detsample goldens MISSING for this platform", red=True, bold=True)
        tr.write_line(f"{len(gs.skipped)} golden comparisons were SKIPPED, NOT passed: "
                      + gs.store.missing_platform_message(), red=True)
