#!/usr/bin/env bash
# detsample on an aarch64 CPU, emulated on an x86-64 host (docs/golden.md, "aarch64 under
# emulation"). Opt-in and slow (the emulated CPU runs ~20x slower than the host).
#
#   bash ci/aarch64.sh setup            # once: ~10-15 min, ~4 GiB, needs root and package registries
#   bash ci/aarch64.sh run CMD...       # CMD inside the arm64 root, cwd = this checkout
#   bash ci/aarch64.sh status           # the root, its size, the emulated CPU, torch / numba
#
#   ci/aarch64.sh run python -m detsample check --quick
#   ci/aarch64.sh run python -m pytest -q tests/arith
#   python -m pytest -m aarch64 tests/aarch64     # native vs emulated, bit for bit
#
# setup: a Debian bookworm arm64 root made by `debootstrap --arch=arm64 --foreign` (first
# stage on the host) and its second stage run inside it through binfmt_misc +
# qemu-user-static (the kernel hands every arm64 ELF to /usr/bin/qemu-aarch64-static; the
# script mounts binfmt_misc and enables Debian's qemu-aarch64 entry when they are missing);
# python3 + venv + pip in it; a venv /opt/venv with torch (PyPI's aarch64 wheel, a CUDA
# build `+cu130`, installed --no-deps: its nvidia-* wheels are gigabytes and useless on a
# CPU, so ci/aarch64_env.py links small stub libraries for the CUDA sonames torch's
# libraries name, and torch reports no CUDA device), and every other dependency of the
# project (pyproject.toml and the test extra, not ray / triton) at the version this host's
# python has (ci/aarch64_env.py pins), downloaded natively (pip download --platform
# manylinux..._aarch64) and installed by the root's pip (--no-index --no-deps); then the
# project, editable, from /repo. Each step is timed; a step already done is skipped
# (remove the root to start over). The figures go to $ROOT.times.
#
# run: a private mount namespace (unshare) with /proc, /dev, /sys and this checkout bound
# at /repo inside the root (plus each folder of $DETSAMPLE_AARCH64_BIND, colon-separated,
# at its own path), then chroot, cwd /repo, PATH starting with /opt/venv/bin, every other
# variable of the caller's environment kept (PYTHONPATH, VIRTUAL_ENV, LD_* dropped;
# NUMBA_CACHE_DIR is the root's own, so the guest never writes numba's cache into the
# checkout). The emulated CPU's /proc/cpuinfo and /sys/devices/system/cpu (its MIDR, hwcaps,
# caches, the host's core count) are bound over the host's x86 ones: QEMU passes the host's
# through, and torch's aarch64 libraries crash on an x86 sysfs. The mounts vanish with the
# command. The CPU is QEMU's model $DETSAMPLE_AARCH64_CPU (default
# neoverse-n1, an Arm Neoverse N1: Graviton2, Ampere Altra), passed as QEMU_CPU.
#
# Environment:
#   DETSAMPLE_AARCH64_ROOT    the root (default ~/.cache/detsample/aarch64-root; never in the repo)
#   DETSAMPLE_AARCH64_CPU     QEMU CPU model (default neoverse-n1; `qemu-aarch64-static -cpu help`)
#   DETSAMPLE_AARCH64_MIRROR  Debian mirror (default http://deb.debian.org/debian)
#   DETSAMPLE_AARCH64_BIND    extra host folders to bind at their own path (colon-separated)
#   PYTHON                    the host python whose package versions are pinned (default python3)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROOT=${DETSAMPLE_AARCH64_ROOT:-$HOME/.cache/detsample/aarch64-root}
CPU=${DETSAMPLE_AARCH64_CPU:-neoverse-n1}
MIRROR=${DETSAMPLE_AARCH64_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
HOST_PY=${PYTHON:-python3}
VENV=/opt/venv
WHEELS="$ROOT.wheels"        # downloaded wheels, beside the root (removed after the install)
TIMES="$ROOT.times"
QEMU=/usr/bin/qemu-aarch64-static
DONE="$ROOT/.detsample-setup-done"

die() { echo "ci/aarch64.sh: $*" >&2; exit 1; }
log() { echo "== $*" >&2; }

need_root() { [ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mounts)"; }

timed() {  # timed NAME CMD...: run, print and record the wall time
    local name=$1 t0 t1
    shift
    log "$name"
    t0=$(date +%s%N)
    "$@"
    t1=$(( ($(date +%s%N) - t0) / 100000000 ))
    printf '%-22s %6d.%d s\n' "$name" $((t1 / 10)) $((t1 % 10)) | tee -a "$TIMES" >&2
}

binfmt_ready() {
    [ -r /proc/sys/fs/binfmt_misc/qemu-aarch64 ] &&
        head -n1 /proc/sys/fs/binfmt_misc/qemu-aarch64 | grep -qx enabled
}

ensure_binfmt() {  # the kernel must hand arm64 ELF files to qemu-aarch64-static
    binfmt_ready && return 0
    [ -e /proc/sys/fs/binfmt_misc/status ] ||
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null ||
        die "binfmt_misc is not mounted and cannot be (mount -t binfmt_misc ... failed): arm64 binaries cannot run here"
    if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
        if command -v update-binfmts >/dev/null && [ -e /usr/share/binfmts/qemu-aarch64 ]; then
            update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
        fi
    fi
    if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
        [ -x "$QEMU" ] || die "$QEMU missing: apt-get install qemu-user-static"
        # F: the kernel opens the interpreter now, so it works inside any chroot
        printf '%s' ':qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:'"$QEMU"':F' \
            > /proc/sys/fs/binfmt_misc/register || die "cannot register qemu-aarch64 with binfmt_misc"
    fi
    [ -w /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && echo 1 > /proc/sys/fs/binfmt_misc/qemu-aarch64
    binfmt_ready || die "binfmt_misc's qemu-aarch64 entry is not enabled"
}

cpu_files() {  # the emulated CPU's /proc/cpuinfo and /sys/devices/system/cpu, made once per model
    local dir="$ROOT/.detsample-cpu/$CPU" ids
    [ -e "$dir/cpuinfo" ] && return 0
    ids=$(QEMU_CPU="$CPU" chroot "$ROOT" /usr/bin/python3 -c "$("$HOST_PY" "$REPO/ci/aarch64_env.py" probe)") ||
        die "the arm64 root does not start python3 under -cpu $CPU"
    # shellcheck disable=SC2086
    "$HOST_PY" "$REPO/ci/aarch64_env.py" cpu-files "$dir" $ids "$(nproc)"
}

# in_root [--bind SRC:DST]... CMD...: CMD chrooted into the root in a private mount namespace
in_root() {
    cpu_files
    local binds=() b
    while [ "${1:-}" = --bind ]; do binds+=("$2"); shift 2; done
    binds+=("$REPO:/repo")
    if [ -n "${DETSAMPLE_AARCH64_BIND:-}" ]; then
        IFS=: read -r -a extra <<<"$DETSAMPLE_AARCH64_BIND"
        for b in "${extra[@]}"; do [ -n "$b" ] && binds+=("$b:$b"); done
    fi
    local script='set -e; R=$1; C=$R/.detsample-cpu/$2; shift 2
        mount -t proc proc "$R/proc"; mount --bind "$C/cpuinfo" "$R/proc/cpuinfo"
        mount --rbind /dev "$R/dev"; mount --rbind /sys "$R/sys"
        mount --bind "$C/sys-cpu" "$R/sys/devices/system/cpu"; mount -t tmpfs tmpfs "$R/tmp"
        while [ "$1" != -- ]; do src=${1%%:*}; dst=${1#*:}; mkdir -p "$R$dst"; mount --bind "$src" "$R$dst"; shift; done
        shift; exec chroot "$R" "$@"'
    env -u PYTHONPATH -u PYTHONHOME -u VIRTUAL_ENV -u LD_LIBRARY_PATH -u LD_PRELOAD -u CONDA_PREFIX \
        PATH="$VENV/bin:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin" \
        HOME=/root QEMU_CPU="$CPU" LANG=C.UTF-8 NUMBA_CACHE_DIR=/root/.cache/numba \
        unshare --mount --propagation private -- bash -c "$script" in_root "$ROOT" "$CPU" "${binds[@]}" -- "$@"
}

setup_host() {
    local missing=()
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    [ -x "$QEMU" ] || missing+=(qemu-user-static)
    command -v update-binfmts >/dev/null || missing+=(binfmt-support)
    command -v aarch64-linux-gnu-ld >/dev/null || missing+=(binutils-aarch64-linux-gnu)
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

stage1() {
    [ -e "$ROOT/debootstrap/debootstrap" ] || [ -e "$ROOT/.detsample-stage2" ] && return 0
    rm -rf "$ROOT"
    debootstrap --arch=arm64 --foreign --variant=minbase \
        --include=python3,python3-venv,python3-pip,ca-certificates \
        "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 ||
        die "debootstrap (first stage) failed: $ROOT.debootstrap.log"
}

stage2() {
    [ -e "$ROOT/.detsample-stage2" ] && return 0
    cp "$QEMU" "$ROOT/usr/bin/"       # for a binfmt entry without the F flag
    chroot "$ROOT" /debootstrap/debootstrap --second-stage >>"$ROOT.debootstrap.log" 2>&1 ||
        die "debootstrap --second-stage failed: $ROOT.debootstrap.log"
    cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
    rm -f "$ROOT"/var/cache/apt/archives/*.deb
    touch "$ROOT/.detsample-stage2"
}

download() {
    mkdir -p "$WHEELS"
    "$HOST_PY" "$REPO/ci/aarch64_env.py" pins >"$WHEELS/pins.txt"
    local torch_version
    torch_version=$("$HOST_PY" -c 'import torch; print(torch.__version__.split("+")[0])')
    echo "torch==$torch_version" >"$WHEELS/torch.txt"
    local plat=()
    for p in manylinux_2_36 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 \
             manylinux_2_24 manylinux_2_17 manylinux2014 linux; do plat+=(--platform "${p}_aarch64"); done
    "$HOST_PY" -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" --python-version 3.11 \
        --implementation cp --abi cp311 --abi abi3 --abi none -d "$WHEELS" \
        -r "$WHEELS/pins.txt" -r "$WHEELS/torch.txt"
}

install_wheels() {
    [ -x "$ROOT$VENV/bin/python" ] || in_root /usr/bin/python3 -m venv "$VENV"
    in_root --bind "$WHEELS:/wheels" /bin/sh -c \
        "$VENV/bin/python -m pip install -q --no-index --no-deps --no-compile /wheels/*.whl"
}

cuda_stubs() {
    local site
    site=$(echo "$ROOT$VENV"/lib/python3*/site-packages)
    "$HOST_PY" "$REPO/ci/aarch64_env.py" stubs "$ROOT" "$site"
    echo /usr/local/lib/detsample-cuda-stubs >"$ROOT/etc/ld.so.conf.d/detsample-cuda-stubs.conf"
    in_root /sbin/ldconfig
}

install_project() {
    in_root "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e /repo
}

verify() {
    in_root "$VENV/bin/python" - <<'EOF'
import platform, torch, numba, numpy
x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
assert numba.njit(lambda v: v + 1)(1) == 2
import detsample
print(f"{platform.machine()} python {platform.python_version()} torch {torch.__version__} "
      f"(cuda available: {torch.cuda.is_available()}, cpu capability {torch.backends.cpu.get_cpu_capability()}) "
      f"numba {numba.__version__} numpy {numpy.__version__}; randn sum {float(x.sum()):.6f}")
EOF
}

cmd_setup() {
    need_root
    mkdir -p "$(dirname "$ROOT")"
    echo "# ci/aarch64.sh setup $(date -u +%FT%TZ), $(nproc) host cores" >>"$TIMES"
    local t0=$SECONDS
    timed host-packages setup_host
    timed binfmt ensure_binfmt
    timed debootstrap-stage1 stage1
    timed debootstrap-stage2 stage2
    timed wheels-download download
    timed pip-install install_wheels
    rm -rf "$WHEELS"
    timed cuda-stubs cuda_stubs
    timed project-install install_project
    timed verify verify
    touch "$DONE"
    printf '%-22s %6d   s\n%-22s %s\n' total $((SECONDS - t0)) disk "$(du -sh "$ROOT" | cut -f1)" | tee -a "$TIMES" >&2
}

cmd_run() {
    [ $# -gt 0 ] || die "usage: ci/aarch64.sh run CMD..."
    [ -e "$DONE" ] || die "no arm64 root at $ROOT: run 'bash ci/aarch64.sh setup' first (as root)"
    need_root
    ensure_binfmt
    in_root /bin/sh -c 'cd /repo && exec "$@"' sh "$@"
}

cmd_status() {
    echo "root: $ROOT ($([ -e "$DONE" ] && echo "set up" || echo "NOT set up: bash ci/aarch64.sh setup"))"
    echo "cpu:  QEMU $($QEMU --version 2>/dev/null | head -n1 | awk '{print $3}') -cpu $CPU"
    if [ -e "$DONE" ]; then
        echo "disk: $(du -sh "$ROOT" | cut -f1)"
        cmd_run python - <<'EOF'
import ctypes, platform, torch, numba
libc = ctypes.CDLL(None)
libc.getauxval.restype = ctypes.c_ulong
print(f"guest: {platform.machine()}, AT_HWCAP {libc.getauxval(16):#x}, AT_HWCAP2 {libc.getauxval(26):#x}, "
      f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), numba {numba.__version__}")
EOF
    fi
}

case "${1:-}" in
    setup) shift; cmd_setup "$@" ;;
    run) shift; cmd_run "$@" ;;
    status) shift; cmd_status "$@" ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
