"""Host-side helpers of ci/aarch64.sh (run natively, by the host's python).

    python ci/aarch64_env.py pins              # the pinned wheels the arm64 root installs
    python ci/aarch64_env.py stubs ROOT SITE   # stub libraries for torch's CUDA dependencies
    python ci/aarch64_env.py probe             # the guest script that reads its CPU's identity
    python ci/aarch64_env.py cpu-files OUT MIDR HWCAP HWCAP2 NCPU   # that CPU's /proc/cpuinfo and sysfs

``pins`` prints ``name==version`` lines: every distribution detsample needs (its
requirements and the ``test`` extra, transitively, markers evaluated for Linux aarch64) at
the version installed in *this* environment, so the emulated run and the native run it is
compared with use the same packages. Left out: torch (ci/aarch64.sh installs it by itself,
``--no-deps``), triton, ray, and torch's CUDA packages (``nvidia-*``, ``cuda-*``).

``stubs``: PyPI's aarch64 torch wheel is a CUDA build (``+cu130``) whose libraries name
libcudart, libcublas, libcudnn, libnccl, ... as DT_NEEDED; the wheels that carry them are
gigabytes and useless on a CPU. This writes, for each such library that is nowhere in the
root, a small aarch64 shared object with the library's soname and version nodes that
defines every symbol torch's libraries import from it (functions return 100,
``cudaErrorNoDevice``: torch then sees no CUDA device; objects are 256 zero bytes), links
them with binutils-aarch64-linux-gnu and registers their folder with the root's ldconfig
(done by ci/aarch64.sh). Nothing of CUDA runs on a CPU, so no stub is ever called but by
``torch.cuda`` probes, which then report no device.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

SKIP = {"torch", "triton", "ray", "detsample"}
CUDA_PREFIXES = ("nvidia-", "cuda-")
STUB_DIR = "usr/local/lib/detsample-cuda-stubs"
REPO = Path(__file__).resolve().parents[1]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> list[str]:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    env = {**default_environment(), "platform_machine": "aarch64", "platform_system": "Linux", "sys_platform": "linux"}
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    roots = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]]
    roots += [Requirement(r) for r in md.distribution("torch").requires or []]
    seen: dict[str, str] = {}
    todo = [(r.name, "") for r in roots if not r.marker or r.marker.evaluate({**env, "extra": ""})]
    while todo:
        name, extra = todo.pop()
        key = _norm(name)
        if key.startswith(CUDA_PREFIXES) or (key in seen and not extra):
            continue
        dist = md.distribution(name)
        if key not in SKIP:
            seen[key] = dist.version
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker and not req.marker.evaluate({**env, "extra": extra}):
                continue
            if _norm(req.name) not in seen and _norm(req.name) not in SKIP:
                todo.append((req.name, ""))
    return [f"{k}=={v}" for k, v in sorted(seen.items())]


def _readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


def _elf(p: Path) -> bool:
    try:
        with p.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


SYM = re.compile(r"^\s*\d+:\s+[0-9a-f]+\s+\d+\s+(\w+)\s+(\w+)\s+\w+\s+(\w+)\s+(\S+)")


def _symbols(p: Path) -> tuple[set[str], list[tuple[str, str, str, str]]]:
    """(defined names, undefined (name, version, type, bind)) of ``p``'s dynamic symbols."""
    defined, undefined = set(), []
    for line in _readelf("--dyn-syms", str(p)).splitlines():
        m = SYM.match(line)
        if not m:
            continue
        typ, bind, ndx, full = m.groups()
        name, _, ver = full.partition("@")
        ver = ver.lstrip("@")
        if ndx == "UND":
            if name:
                undefined.append((name, ver, typ, bind))
        elif bind in ("GLOBAL", "WEAK", "GNU_UNIQUE"):
            defined.add(name)
    return defined, undefined


def _needed(p: Path) -> list[str]:
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _readelf("-d", str(p)))


def _version_files(p: Path) -> dict[str, str]:
    """version name -> the file its version-needs entry names."""
    out, current = {}, None
    for line in _readelf("-V", str(p)).splitlines():
        m = re.search(r"File: (\S+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"Name: (\S+)\s+Flags", line)
        if m and current:
            out[m.group(1)] = current
    return out


def stubs(root: Path, site: Path) -> list[str]:
    torch_dir = site / "torch"
    elves = [p for p in sorted(torch_dir.rglob("*.so*")) if p.is_file() and _elf(p)]
    lib_dirs = [root / d for d in ("lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib", "usr/local/lib")]
    present = {p.name for d in lib_dirs if d.is_dir() for p in d.iterdir()}
    present |= {p.name for p in elves}
    system = [p for d in lib_dirs[:2] if d.is_dir() for p in sorted(d.glob("*.so*")) if p.is_file() and _elf(p)]
    system += [p for p in sorted((root / "usr/bin").glob("python3*")) if p.is_file() and _elf(p)]
    defined: set[str] = set()
    for p in system + elves:
        defined |= _symbols(p)[0]
    wanted: dict[str, dict[str, dict[str, str]]] = {}  # lib -> version ("" none) -> name -> type
    for p in elves:
        missing = [n for n in _needed(p) if n not in present]
        if not missing:
            continue
        files = _version_files(p)
        for name, ver, typ, bind in _symbols(p)[1]:
            if bind == "WEAK" or (not ver and name in defined):
                continue
            lib = files.get(ver) if ver else missing[0]
            if lib in missing:
                wanted.setdefault(lib, {}).setdefault(ver, {})[name] = typ
        for lib in missing:
            wanted.setdefault(lib, {})
        for ver, lib in files.items():
            if lib in missing:
                wanted[lib].setdefault(ver, {})
    out = root / STUB_DIR
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".build"
    tmp.mkdir(exist_ok=True)
    for lib, versions in sorted(wanted.items()):
        asm, script, seen = [".text"], [], set()
        for _ver, names in sorted(versions.items()):
            for name, typ in sorted(names.items()):
                if name in seen:
                    continue
                seen.add(name)
                if typ == "OBJECT" or typ == "TLS":
                    asm += [
                        ".data",
                        f".globl {name}",
                        f".type {name}, %object",
                        f".size {name}, 256",
                        ".balign 16",
                        f"{name}:",
                        ".zero 256",
                        ".text",
                    ]
                else:
                    asm += [
                        f".globl {name}",
                        f".type {name}, %function",
                        ".balign 4",
                        f"{name}:",
                        "mov w0, #100",
                        "ret",
                    ]
        nodes = [v for v in versions if v]
        for i, ver in enumerate(sorted(nodes)):
            names = sorted(versions[ver])
            if i == 0:  # unversioned imports bind to the first node
                names = sorted(set(names) | set(versions.get("", {})))
            body = "".join(f" {n};" for n in names)
            script.append(f"{ver} {{ global:{body} }};" if body else f"{ver} {{ }};")
        (tmp / f"{lib}.s").write_text("\n".join(asm) + "\n")
        (tmp / f"{lib}.o").unlink(missing_ok=True)
        subprocess.run(["aarch64-linux-gnu-as", "-o", str(tmp / f"{lib}.o"), str(tmp / f"{lib}.s")], check=True)
        cmd = ["aarch64-linux-gnu-ld", "-shared", "-soname", lib, "-o", str(out / lib), str(tmp / f"{lib}.o")]
        if script:
            (tmp / f"{lib}.map").write_text("\n".join(script) + "\n")
            cmd[1:1] = ["--version-script", str(tmp / f"{lib}.map")]
        subprocess.run(cmd, check=True)
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()
    return [f"{lib}: {sum(len(v) for v in vs.values())} symbols" for lib, vs in sorted(wanted.items())]


#: Linux's arm64 AT_HWCAP / AT_HWCAP2 bit names (arch/arm64/include/uapi/asm/hwcap.h), as
#: /proc/cpuinfo's "Features" line writes them
HWCAP = [
    "fp",
    "asimd",
    "evtstrm",
    "aes",
    "pmull",
    "sha1",
    "sha2",
    "crc32",
    "atomics",
    "fphp",
    "asimdhp",
    "cpuid",
    "asimdrdm",
    "jscvt",
    "fcma",
    "lrcpc",
    "dcpop",
    "sha3",
    "sm3",
    "sm4",
    "asimddp",
    "sha512",
    "sve",
    "asimdfhm",
    "dit",
    "uscat",
    "ilrcpc",
    "flagm",
    "ssbs",
    "sb",
    "paca",
    "pacg",
]  # noqa: E501 - the kernel's table
HWCAP2 = [
    "dcpodp",
    "sve2",
    "sveaes",
    "svepmull",
    "svebitperm",
    "svesha3",
    "svesm4",
    "flagm2",
    "frint",
    "svei8mm",
    "svef32mm",
    "svef64mm",
    "svebf16",
    "i8mm",
    "bf16",
    "dgh",
    "rng",
    "bti",
    "mte",
    "ecv",
    "afp",
    "rpres",
    "mte3",
    "sme",
    "sme_i16i64",
    "sme_f64f64",
    "sme_i8i32",
    "sme_f16f32",
    "sme_b16f32",
    "sme_f32f32",
    "sme_fa64",
    "wfxt",
    "ebf16",
    "sve_ebf16",
]  # noqa: E501 - the kernel's table

#: what the guest reads to learn its CPU: MIDR_EL1 (by ``mrs``, which QEMU serves to user
#: mode as Linux does) and the auxiliary vector's hwcaps
PROBE = """
import ctypes, mmap, struct
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(struct.pack("<II", 0xd5380000, 0xd65f03c0))       # mrs x0, midr_el1; ret
midr = ctypes.CFUNCTYPE(ctypes.c_uint64)(ctypes.addressof(ctypes.c_char.from_buffer(m)))()
libc = ctypes.CDLL(None)
libc.getauxval.restype = ctypes.c_ulong
print(hex(midr), hex(libc.getauxval(16)), hex(libc.getauxval(26)))
"""


def cpu_files(out: Path, midr: int, hwcap: int, hwcap2: int, ncpu: int) -> None:
    """An arm64 machine's ``/proc/cpuinfo`` and ``/sys/devices/system/cpu`` for the emulated
    CPU (``out/cpuinfo``, ``out/sys-cpu``), bound over the host's x86 ones in the root: QEMU
    user mode passes the host's files through, and torch's aarch64 libraries crash on the
    x86 sysfs (xbyak_aarch64 / cpuinfo). Caches: 64 KiB L1 I and D and 1 MiB L2 per core,
    a Neoverse N1's."""
    feats = [n for i, n in enumerate(HWCAP) if hwcap >> i & 1]
    feats += [n for i, n in enumerate(HWCAP2) if hwcap2 >> i & 1]
    every = "0" if ncpu == 1 else f"0-{ncpu - 1}"
    text = []
    for i in range(ncpu):
        text += [
            f"processor\t: {i}",
            "BogoMIPS\t: 50.00",
            f"Features\t: {' '.join(feats)}",
            f"CPU implementer\t: {midr >> 24 & 0xFF:#x}",
            "CPU architecture: 8",
            f"CPU variant\t: {midr >> 20 & 0xF:#x}",
            f"CPU part\t: {midr >> 4 & 0xFFF:#05x}",
            f"CPU revision\t: {midr & 0xF}",
            "",
        ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpuinfo").write_text("\n".join(text) + "\n")
    sys_cpu = out / "sys-cpu"
    files = {"possible": every, "present": every, "online": every, "offline": "", "kernel_max": "255"}
    caches = ((1, "Data", "64K"), (1, "Instruction", "64K"), (2, "Unified", "1024K"))
    for i in range(ncpu):
        c = f"cpu{i}/"
        files[c + "online"] = "1"
        files[c + "regs/identification/midr_el1"] = f"0x{midr:016x}"
        files[c + "regs/identification/revidr_el1"] = "0x0000000000000000"
        files.update(
            {
                c + "topology/physical_package_id": "0",
                c + "topology/core_id": str(i),
                c + "topology/cluster_id": "0",
                c + "topology/thread_siblings_list": str(i),
                c + "topology/core_siblings_list": every,
                c + "topology/cluster_cpus_list": every,
                c + "topology/package_cpus_list": every,
            }
        )
        for j, (level, kind, size) in enumerate(caches):
            d = f"{c}cache/index{j}/"
            files.update(
                {
                    d + "level": str(level),
                    d + "type": kind,
                    d + "size": size,
                    d + "shared_cpu_list": str(i),
                    d + "coherency_line_size": "64",
                }
            )
    for rel, value in files.items():
        (sys_cpu / rel).parent.mkdir(parents=True, exist_ok=True)
        (sys_cpu / rel).write_text(value + "\n")


def main(argv: list[str]) -> int:
    if argv[:1] == ["pins"]:
        print("\n".join(pins()))
        return 0
    if argv[:1] == ["stubs"] and len(argv) == 3:
        for line in stubs(Path(argv[1]), Path(argv[2])):
            print(line)
        return 0
    if argv[:1] == ["probe"]:
        print(PROBE)
        return 0
    if argv[:1] == ["cpu-files"] and len(argv) == 6:
        cpu_files(Path(argv[1]), *(int(a, 0) for a in argv[2:5]), int(argv[5]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
