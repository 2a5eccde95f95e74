#!/usr/bin/env bash
# The gate: the README's test command, then the `detsample check` battery.
set -euo pipefail
cd "$(dirname "$0")/.."
# What this emulates, and why (docs/golden.md):
# - goldens are per ATen instruction set and only cpu-avx2-* / cpu-default-* are committed:
#   on any AVX2-capable CPU run torch's AVX2 kernels (on an AVX-512 CPU that is an emulation
#   by ATEN_CPU_CAPABILITY; tests/conftest.py does the same for a bare `pytest`);
# - MKL's own code path is NOT emulated here: the suite runs MKL's native path (the
#   batch-invariant mode verifies what it relies on at run time, and
#   tests/invariant/test_portable.py runs every MKL_ENABLE_INSTRUCTIONS level in
#   subprocesses); `detsample check` re-runs itself under MKL_ENABLE_INSTRUCTIONS=SSE4_2,
#   the goldens' level, when this machine's MKL vector math differs from theirs, and says so.
if [ -z "${ATEN_CPU_CAPABILITY:-}" ] && grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
    export ATEN_CPU_CAPABILITY=avx2
fi
python3 -m pytest -q
python3 -m detsample check --quick --json "${TMPDIR:-/tmp}/detsample-check.json"
