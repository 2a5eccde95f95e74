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
