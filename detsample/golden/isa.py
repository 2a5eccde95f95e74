"""CPU instruction sets: which ones this machine can run, and commands run under each.

torch picks its CPU kernels by instruction set (``default``, ``avx2``, ``avx512`` on
x86-64) and rounds differently per set, so CPU goldens have one folder per set
(:mod:`detsample.golden.fingerprint`). ``ATEN_CPU_CAPABILITY=<isa>`` makes torch
dispatch exactly that set's kernels (and report it, hence the fingerprint) on any CPU
that supports it, so one machine can regenerate the folders of every set up to its own:
the folder of the machine's own best set is produced **natively**, the others are
**emulated**. A set the CPU lacks is never run: torch would accept the variable and
die on an illegal instruction.

On x86-64 the sets are ``default < avx2 < avx512``; on other CPUs only ``default`` and
the set torch picks there by itself.

The scenario goldens do not depend on the set any more (the sampler's arithmetic is
detsample's own, :mod:`detsample.arith`): one folder serves every set, and running a
command under each set (:func:`run_per_isa`) is how ``--isa all`` shows it. Each
manifest still records, as provenance, where it was made (:func:`dispatch_info`: the set,
native or emulated, MKL's level and a probe of torch's own ``exp`` / ``log``, which the
sampler no longer uses). Tensor goldens (a user's kernels) keep one folder per set.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from detsample.golden.format import GoldenFormatError, dispatch_problem, load_json, read_golden, text_of

ENV = "ATEN_CPU_CAPABILITY"
MKL_ENV = "MKL_ENABLE_INSTRUCTIONS"
X86_ORDER = ("default", "avx2", "avx512")
Echo = Callable[[str], None]


def current_isa() -> str:
    """The set torch dispatches to in this process, lower case (``avx2``)."""
    return torch.backends.cpu.get_cpu_capability().strip().lower()


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def supported_isas() -> list[str]:
    """Every set this CPU can run, lowest first (``['default', 'avx2']`` on an AVX2
    machine). On x86-64 from the CPU's own flags (cpuinfo, no kernel runs), whatever
    ``ATEN_CPU_CAPABILITY`` says; elsewhere ``default`` and the set torch runs when it
    is unforced or forced to that set (torch checks those sets itself: a forced SVE256
    the CPU lacks falls back to ``default``)."""
    if _is_x86():
        flags = {
            "default": True,
            "avx2": bool(torch.cpu._is_avx2_supported()),
            "avx512": bool(torch.cpu._is_avx512_supported()),
        }
        return [i for i in X86_ORDER if flags[i]]
    forced = os.environ.get(ENV)
    cur = current_isa()
    return ["default"] + ([cur] if cur != "default" and forced in (None, "", cur) else [])


def forced_isa_problem() -> str | None:
    """None when ``ATEN_CPU_CAPABILITY`` is unset, empty or exactly a set this CPU runs
    (:func:`supported_isas`); otherwise one line naming the variable, its value and those
    sets. torch dispatches a forced set's kernels without asking the CPU (an illegal
    instruction later), and ignores a value it does not know (its own best set runs, not
    the one asked for). Reads the CPU's flags only: no torch kernel runs, so a command
    can refuse before its first one."""
    value = os.environ.get(ENV, "")
    ok = supported_isas()
    if not value or value in ok:
        return None
    return f"{ENV}={value}: this CPU supports {', '.join(ok)}"


def native_isa() -> str:
    """The set torch picks on this CPU when nothing forces it (the best supported)."""
    return supported_isas()[-1]


def mkl_instructions() -> str:
    """``MKL_ENABLE_INSTRUCTIONS`` as this process was started with (``"native"``: unset,
    MKL picks its best path for the CPU)."""
    return os.environ.get(MKL_ENV, "").strip().upper() or "native"


def vml_probe() -> str:
    """12 hex digits: a hash of torch's float32 ``exp`` and ``log`` on 65,536 fixed
    inputs, which tells MKL vector-math code paths apart (measured: SSE4.2, AVX2 and
    AVX-512 on one Xeon give three hashes)."""
    import hashlib

    g = torch.Generator().manual_seed(20261201)
    x = torch.randn(1 << 16, generator=g) * 6
    h = hashlib.sha256(torch.exp(x).numpy().tobytes())
    h.update(torch.log(x.abs() + 1e-3).numpy().tobytes())
    return h.hexdigest()[:12]


def dispatch_info() -> dict[str, str]:
    """For CPU golden manifests: ``mode`` native (this process runs the CPU's own best
    set) or emulated (a lower set forced by ``ATEN_CPU_CAPABILITY``), ``machine_isa``, the
    CPU's own best set, ``mkl`` the MKL level (:func:`mkl_instructions`) and ``vml`` its
    vector-math probe (:func:`vml_probe`)."""
    cur, nat = current_isa(), native_isa()
    return {
        "mode": "native" if cur == nat else "emulated",
        "machine_isa": nat,
        "mkl": mkl_instructions(),
        "vml": vml_probe(),
    }


def recorded_dispatch(platform_dir: Path) -> list[dict]:
    """The ``cpu_dispatch`` of every readable manifest under ``platform_dir`` (a golden
    platform folder); unreadable manifests are skipped (verify reports them)."""
    out = []
    for man in sorted(Path(platform_dir).glob("*/manifest.json")):
        try:
            doc = load_json(text_of(read_golden(man), str(man)), str(man))
        except (OSError, GoldenFormatError):
            continue
        if (
            isinstance(doc, dict) and isinstance(doc.get("cpu_dispatch"), dict) and dispatch_problem(doc) is None
        ):  # a malformed one: verify names it
            out.append(doc["cpu_dispatch"])
    return out


def describe() -> str:
    """One line: which set runs and how (``avx2, native`` / ``default, emulated with
    ATEN_CPU_CAPABILITY=default on an avx2 CPU``)."""
    d = dispatch_info()
    if d["mode"] == "native":
        return f"cpu ISA {current_isa()}, native"
    return f"cpu ISA {current_isa()}, emulated with {ENV}={os.environ.get(ENV)} on an {d['machine_isa']} CPU"


def resolve(spec: str) -> list[str]:
    """ISAs named by ``spec``: ``all`` (every supported set), ``current`` (this process's),
    or a comma-separated list of supported sets. ValueError for an unknown or
    unsupported set (running it would crash on an illegal instruction)."""
    ok = supported_isas()
    if spec == "all":
        return ok
    if spec == "current":
        return [current_isa()]
    out = []
    for name in (s.strip().lower() for s in spec.split(",")):
        if name not in ok:
            raise ValueError(f"isa must be 'all', 'current' or sets this CPU supports ({', '.join(ok)}), got {name!r}")
        out.append(name)
    return out


def run_under(isa: str | None, argv: Sequence[str], echo: Echo, cwd: str | None = None) -> int:
    """Run ``argv`` with ``ATEN_CPU_CAPABILITY=isa`` (None: as this process has it),
    passing every output line (stdout and stderr merged) to ``echo``; return its exit
    status."""
    env = dict(os.environ)
    if isa is not None:
        env[ENV] = isa
    proc = subprocess.Popen(
        list(argv), env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    assert proc.stdout is not None
    with proc.stdout:
        for line in proc.stdout:
            echo(line.rstrip("\n"))
    return proc.wait()


def run_per_isa(
    isas: Sequence[str], argv: Sequence[str], echo: Echo, cwd: str | None = None, then: Sequence[str] | None = None
) -> list[tuple[str, int]]:
    """:func:`run_under` for each set in turn (one at a time: goldens are CPU work):
    ``argv`` under the first set, ``then`` (default ``argv``) under the others; a header
    line per set and a closing summary go to ``echo``. Returns ``[(isa, exit status)]``."""
    nat = native_isa()
    results = []
    for i, name in enumerate(isas):
        cmd = argv if i == 0 or then is None else then
        how = "native" if name == nat else f"emulated on an {nat} CPU"
        echo(f"==> {ENV}={name} ({how}): {' '.join(cmd)}")
        results.append((name, run_under(name, cmd, echo, cwd)))
    echo("==> per ISA: " + ", ".join(f"{i} {'ok' if rc == 0 else f'FAILED (exit {rc})'}" for i, rc in results))
    return results
