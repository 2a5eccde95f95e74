#!/usr/bin/env bash
# The GPU check: run from a clone on a machine with one CUDA device (docs/gpu.md).
#
#   bash ci/gpu-check.sh            # at most 8.5 minutes: the step limits add up to 510 s
#   OUT=/some/dir bash ci/gpu-check.sh   # keep the logs and JSON reports there
#
# 1. install: the project with its test and gpu extras, next to the CUDA torch already
#    present (a torch is installed only when none is: pip's default, the CUDA build);
# 2. the GPU gives the CPU's bits (docs/gpu.md "Across devices"): pytest -m gpu -k cpus_bits,
#    the Triton spelling of detsample.arith (exp, log, exact sums), log_softmax, the
#    normalisers, the masses and tokens, and Sampler() on CUDA against Sampler() on CPU,
#    each bit for bit with no tolerance;
#    then the other GPU tests: pytest -m gpu (row invariance, run-to-run, tl.philox bits,
#    matmul / row-wise / attention invariance);
# 3. the quick goldens for this GPU's platform fingerprint (cuda-sm90-torch...), written
#    to $OUT/golden, compared file by file (tokens, logprobs, top logprobs) with the
#    CPU's folder golden/cpu (the same bits expected), then
#    `detsample check --quick --device cuda` against them: a second process must
#    reproduce every bit (the first run also fills Triton's kernel cache);
# 4. `detsample bench --device cuda --matmul`: sampler step vs a bare log_softmax, the
#    invariant matmul vs cuBLAS;
# 5. `detsample probe ops --device cuda` when the command exists;
# then one summary table. Exit status 0 only when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d -t detsample-gpu.XXXXXX)}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
STEPS=()
START=$(date +%s)

step() {  # step NAME LIMIT_SECONDS CMD...: run with a time limit, log to $OUT/NAME.log
    local name=$1 limit=$2 t0 rc
    shift 2
    t0=$(date +%s)
    echo "== $name (limit ${limit}s): $*"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    tail -n 25 "$OUT/$name.log"
    STEPS+=("$name|$rc|$(( $(date +%s) - t0 ))")
}

if ! $PY -c "import torch" 2>/dev/null; then
    step install-torch 90 $PY -m pip install -q torch
fi
step install 90 $PY -m pip install -q -e '.[test,gpu]'
step cuda 20 $PY -c "import torch, triton; assert torch.cuda.is_available(), 'no CUDA device'; \
print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
step pytest-cpu-bits 80 $PY -m pytest -q -m gpu -k cpus_bits tests/kernels -p no:cacheprovider
step pytest-gpu 60 $PY -m pytest -q -m gpu -k "not cpus_bits" tests/ -p no:cacheprovider
step golden-update 60 $PY -m detsample golden update --quick --device cuda \
    --golden-dir "$OUT/golden" --force
step golden-vs-cpu 10 $PY - "$OUT/golden" golden/cpu <<'PYEOF'
import sys
from pathlib import Path

gpu_root, cpu = Path(sys.argv[1]), Path(sys.argv[2])
folders = [d for d in gpu_root.iterdir() if d.is_dir()]
assert len(folders) == 1, f"expected one platform folder under {gpu_root}: {folders}"
differ, same = [], 0
for scen in sorted(p for p in folders[0].iterdir() if p.is_dir()):
    for f in ("tokens.txt", "logprobs.txt", "top_logprobs.txt"):
        g, c = scen / f, cpu / scen.name / f
        if not g.exists() and not c.exists():
            continue
        if not g.exists() or not c.exists() or g.read_bytes() != c.read_bytes():
            differ.append(f"{scen.name}/{f}")
        else:
            same += 1
print(f"{same} golden files equal to golden/cpu's; {len(differ)} differ: {differ}")
sys.exit(1 if differ or not same else 0)
PYEOF
step check 50 $PY -m detsample check --quick --device cuda --golden-dir "$OUT/golden" \
    --json "$OUT/check.json"
step bench 90 $PY -m detsample bench --device cuda --batch 1 64 --vocab 32000 152064 \
    --repeat 20 --matmul --json "$OUT/bench.json"
if $PY -m detsample probe --help >/dev/null 2>&1; then
    step probe-ops 50 $PY -m detsample probe ops --device cuda --json "$OUT/probe.json"
fi

$PY - "$OUT" "${STEPS[@]}" <<'EOF'
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
steps = [s.split("|") for s in sys.argv[2:]]
print("\n==== detsample GPU check summary ====")
print(f"{'step':<16} {'result':<8} {'seconds':>7}")
for name, rc, secs in steps:
    res = "PASS" if rc == "0" else ("TIMEOUT" if rc == "124" else f"FAIL({rc})")
    print(f"{name:<16} {res:<8} {secs:>7}")
bench = out / "bench.json"
if bench.exists():
    data = json.loads(bench.read_text())
    rows = data["sampler"] if isinstance(data, dict) else data
    base = {(r["B"], r["V"], r["config"]): r["median_ms"] for r in rows
            if r["path"] == "bare log_softmax"}
    print("\nsampler step (Triton backend) / bare torch.log_softmax, same logits:")
    for r in rows:
        key = (r["B"], r["V"], r["config"])
        if r["path"] == "deterministic" and base.get(key):
            print(f"  B={r['B']:<3} V={r['V']:<6} {r['config']:<22} {r['median_ms']:.3f} ms "
                  f"= {r['median_ms'] / base[key]:.2f}x")
    for r in (data.get("matmul", []) if isinstance(data, dict) else []):
        print(f"  matmul {r['dtype']:<8} M={r['M']:<4} K=N={r['K']}: "
              f"{r['fraction_of_cublas']:.2f} of cuBLAS ({r['invariant_tflops']} TFLOP/s)")
check = out / "check.json"
if check.exists():
    rep = json.loads(check.read_text())
    bad = [c["name"] for c in rep.get("checks", []) if not c.get("ok")]
    print(f"\ncheck on {rep.get('platform')}: {'ok' if rep.get('ok') else 'FAILED: ' + ', '.join(bad)}")
print(f"\nlogs and reports: {out}")
sys.exit(0 if all(rc == "0" for _, rc, _ in steps) else 1)
EOF
RC=$?
echo "total: $(( $(date +%s) - START )) s"
exit $RC
