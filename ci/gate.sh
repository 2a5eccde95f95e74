#!/usr/bin/env bash
# The gate: the README's test command, then the `detsample check` battery.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pytest -q
python3 -m detsample check --quick --json "${TMPDIR:-/tmp}/detsample-check.json"
