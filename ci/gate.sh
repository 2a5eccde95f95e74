#!/usr/bin/env bash
# The gate: the README's test command, then the `detsample check` battery.
set -euo pipefail
cd "$(dirname "$0")/.."
# No emulation: the goldens (golden/cpu) are one set for every CPU, instruction set and
# MKL path (the sampler's arithmetic is detsample's own; docs/golden.md), so the suite and
# the check run this machine's own kernels.
# lint and format first (pyproject.toml [tool.ruff]; ruff is pinned in the test extra)
python3 -m ruff check detsample tests oracles ci
python3 -m ruff format --check detsample tests oracles ci
python3 -m pytest -q
python3 -m detsample check --quick --json "${TMPDIR:-/tmp}/detsample-check.json"
