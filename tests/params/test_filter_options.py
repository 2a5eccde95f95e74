"""The filter table (``detsample.params.FILTER_OPTIONS``): the command line, the audit's
semantics and diagnosis and the rollout take their filters from it.

Bugs pinned: min-p was spelt by hand in the CLI's semantics options, the audit's
``FILTER_DEFAULTS``, the diagnosis's grid and the rollout (which had no ``--min-p`` and
whose ``generate_rollouts`` took temperature / top_p / top_k as loose keywords), so a
filter wanted on the command line and in the audit touched 8-9 files; a table row that
disagrees with ``SamplingParams`` or ``rules.ELEMENT_FILTERS``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from detsample.params import FILTER_OPTIONS, SamplingParams, filter_options
from detsample.rules import ELEMENT_FILTERS


def test_the_table_agrees_with_the_params_and_the_element_registry():
    names = [o.name for o in filter_options()]
    assert names[:2] == ["top_k", "top_p"]
    for f in ELEMENT_FILTERS:  # every element-wise filter has its row, with its neutral value
        assert f.name in names
        assert next(o for o in FILTER_OPTIONS if o.name == f.name).neutral == f.neutral
    for o in FILTER_OPTIONS:
        assert getattr(SamplingParams(seed=0), o.name) == o.neutral
        for v in o.grid:  # every grid value is a valid setting of the field, not the neutral one
            assert getattr(SamplingParams(seed=0, **{o.name: v}), o.name) == v != o.neutral


#: run in a fresh interpreter: the table without min-p is set before any harness module
#: is imported; prints what the harness then offers
PROBE = r"""
import contextlib, io, json, sys
import detsample.params as P
if sys.argv[1] == "without":
    P.FILTER_OPTIONS = tuple(o for o in P.FILTER_OPTIONS if o.name != "min_p")
from detsample.cli import main
from detsample.audit.semantics import ROW_FIELDS, Semantics
from detsample.audit.analysis import diagnose
out = {}
for cmd in ("audit", "rollout", "audit-log"):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        main([cmd, "--help"])
    out[cmd] = "--min-p" in buf.getvalue()
out["row_fields"] = "min_p" in ROW_FIELDS
out["grid"] = any(n == "min_p" for f in diagnose.FILTER_GRID for n, _ in f)
try:
    out["semantics"] = Semantics("processed", 1.0, min_p=0.1).min_p
except TypeError:
    out["semantics"] = None
print(json.dumps(out))
"""


@pytest.mark.parametrize("table", ["with", "without"])
def test_the_harness_offers_exactly_the_filters_of_the_table(table):
    """The CLI's options, the per-row columns, the audit's Semantics and the diagnosis's
    grid follow the table: the table without min-p gives a harness without it, not a
    crash, and nothing in those files had to change."""
    run = subprocess.run([sys.executable, "-c", PROBE, table], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    has = table == "with"
    assert got == {
        "audit": has,
        "rollout": has,
        "audit-log": False,
        "row_fields": has,
        "grid": has,
        "semantics": 0.1 if has else None,
    }


def test_rollout_min_p_reaches_the_engine_and_the_audit_rescores_it(tmp_path):
    """``rollout --min-p`` (new: from the table) samples with min-p, and an audit in the
    same processed semantics is exact; without it the same seeds give other logprobs."""
    from detsample.cli import main

    def roll(name, *extra):
        path = tmp_path / name
        assert (
            main(
                [
                    "rollout",
                    str(path),
                    "--num-sequences",
                    "3",
                    "--max-new-tokens",
                    "6",
                    "--temperature",
                    "0.8",
                    "--logprobs-mode",
                    "processed",
                    *extra,
                ]
            )
            == 0
        )
        return path, [json.loads(line) for line in path.read_text().splitlines()]

    path, recs = roll("m.jsonl", "--min-p", "0.2")
    _, plain = roll("p.jsonl")
    assert [r["engine_logprobs"] for r in recs] != [r["engine_logprobs"] for r in plain]
    report = tmp_path / "a.json"
    assert (
        main(
            [
                "audit",
                str(path),
                "--rescore",
                "refmodel",
                "--logprobs-mode",
                "processed",
                "--temperature",
                "0.8",
                "--min-p",
                "0.2",
                "--json",
                str(report),
            ]
        )
        == 0
    )
    doc = json.loads(report.read_text())
    metrics = doc.get("metrics", doc)
    assert metrics["exact_match_fraction"] == 1.0
