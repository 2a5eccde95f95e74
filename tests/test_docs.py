"""The docs name files that exist.

Bug pinned: docs/sampling-penalties.md sent readers to ``detsample/penalty_state.py``,
``batch_update.py``, ``processors.py`` and ``processors_builtin.py`` after those modules
had moved into ``detsample/processors/`` (and docs/golden.md and docs/audit.md named
modules of the old flat layout the same way).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
#: a repository path in backquotes: `detsample/...`, `tests/...`, `oracles/...`, ...
PATH = re.compile(r"`((?:detsample|tests|oracles|ci|golden)/[A-Za-z0-9_./-]+)`")
#: paths a doc names on purpose although the repository has no such file
NOT_OURS = {
    "tests/test_my_kernel_golden.py": "the file a kernel developer writes from the template",
}


def named_paths(doc: Path) -> list[str]:
    return sorted({m.group(1).rstrip(".") for m in PATH.finditer(doc.read_text())})


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_a_doc_names_exists(doc):
    missing = [p for p in named_paths(doc) if p not in NOT_OURS and not (ROOT / p).exists()]
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


#: a tracker reference ("issue" followed by a number), spelled so this file does not match
TRACKER = re.compile("issue" + r"s?\s*#?\d", re.I)
SOURCES = [
    p
    for d in ("detsample", "tests", "docs", "oracles", "ci")
    for p in sorted((ROOT / d).rglob("*"))
    if p.suffix in (".py", ".md", ".sh", ".toml")
]


def test_nothing_names_a_tracker_number():
    """Code, docs and tests name the bug they pin, never a tracker's number (a reader
    without the tracker learns nothing from it)."""
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in SOURCES + [ROOT / "README.md"]
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if TRACKER.search(line)
    ]
    assert not found, found
