#!/usr/bin/env bash
# The gate: the README's test command, then the `detsample check` battery.
set -euo pipefail
cd "$(dirname "$0")/.."
# Goldens are per CPU instruction set. CI machines of one kind may differ (AVX2 or AVX-512):
# run torch's AVX2 kernels wherever the CPU has AVX2, so every such machine compares against
# the same golden/cpu-avx2-* folder (emulated on an AVX-512 CPU; see docs/golden.md).
if [ -z "${ATEN_CPU_CAPABILITY:-}" ] && grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
    export ATEN_CPU_CAPABILITY=avx2
fi
python3 -m pytest -q
python3 -m detsample check --quick --json "${TMPDIR:-/tmp}/detsample-check.json"
