"""The mode's invariance properties in one process, for another CPU's BLAS code path.

tests/invariant/test_cpus.py runs this file under ``qemu-x86_64 -cpu MODEL`` (MKL picks its
kernels from the CPU's vendor and features, so an emulated AMD EPYC or Intel Haswell takes
that vendor's code path on any x86 host) and natively. It must not start subprocesses:
they would run natively. It prints one JSON line: the failures (empty when every property
held) and hashes of the portable results (the same on every CPU by construction).

    python tests/invariant/cpus_child.py [narrow|products|sums|pointwise|model ...]

Properties, under the verified and the portable kernels, at 1 and 2 threads:

* products: every row of a 130-row ``F.linear`` (B transposed: ``nt``) and of ``a @ w``
  (``nn``) equals the row computed alone, for narrow and odd shapes (K = 160, N = 7 and
  K = 200, N = 5 are the shapes MKL's AMD path rounded by the output row's alignment),
  also from misaligned inputs; a batched product's matrices equal each alone;
* sums: a row's sum equals its sum alone;
* pointwise: ``silu`` / ``exp`` / ``tanh`` of an element do not depend on its position;
* model: a tiny Llama's prefill == decode == left/right-padded batch (slow: opt-in).
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch
import torch.nn.functional as F

from detsample import batch_invariant
from detsample.probe.threads import torch_threads

SHAPES = ((160, 7), (200, 5), (33, 130), (96, 64))  # (K, N)
COUNTS = (1, 2, 5, 64, 65, 130)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _misaligned(x: torch.Tensor, off: int) -> torch.Tensor:
    buf = torch.empty(x.numel() + off)
    return buf[off:].view_as(x).copy_(x)


def _rows_alone(f, x: torch.Tensor, label: str) -> list[str]:
    """Rows of ``f`` over the first c rows of ``x`` (c in COUNTS) against each row alone."""
    alone = torch.cat([f(x[i : i + 1]) for i in range(x.shape[0])])
    bad = [
        f"{label}: row {i} of {c} != alone"
        for c in COUNTS
        if c <= x.shape[0]
        for i in torch.nonzero(~(f(x[:c]) == alone[:c]).all(dim=1)).flatten().tolist()[:3]
    ]
    return bad


def products(shapes: tuple[tuple[int, int], ...] = SHAPES) -> tuple[list[str], torch.Tensor]:
    bad, outs = [], []
    for k, n in shapes:
        g = _gen(k * 1000 + n)
        x = torch.randn(max(COUNTS), k, generator=g)
        w = torch.randn(n, k, generator=g) * k**-0.5
        wn = w.t().contiguous()
        bad += _rows_alone(lambda a: F.linear(a, w), x, f"linear K={k} N={n} (nt)")
        bad += _rows_alone(lambda a: a @ wn, x, f"matmul K={k} N={n} (nn)")
        bad += _rows_alone(lambda a: F.linear(_misaligned(a, 3), w), x, f"linear K={k} N={n} misaligned")
        outs.append(F.linear(x, w).flatten())
    g = _gen(5)
    a, b = torch.randn(3, 20, 48, generator=g), torch.randn(3, 48, 17, generator=g)
    both = torch.bmm(a, b)
    for i in range(3):
        if not torch.equal(both[i : i + 1], torch.bmm(a[i : i + 1], b[i : i + 1])):
            bad.append(f"bmm: matrix {i} of 3 != alone")
        bad += _rows_alone(lambda r: torch.bmm(r.unsqueeze(0), b[i : i + 1])[0], a[i], f"bmm matrix {i}")
    outs.append(both.flatten())
    return bad, torch.cat(outs)


def sums() -> tuple[list[str], torch.Tensor]:
    bad, outs = [], []
    for n in (1000, 5000):
        x = torch.randn(33, n, generator=_gen(n))
        bad += _rows_alone(lambda r: r.sum(dim=1, keepdim=True), x, f"sum of {n}")
        outs.append(x.sum(dim=1))
    return bad, torch.cat(outs)


def pointwise() -> tuple[list[str], torch.Tensor]:
    bad, outs = [], []
    x = torch.randn(1, 4099, generator=_gen(3)) * 6
    for name, f in (("silu", F.silu), ("exp", torch.exp), ("tanh", torch.tanh)):
        full = f(x)
        for shift in (1, 7, 33):
            got = f(x[:, shift:])
            if not torch.equal(got, full[:, shift:]):
                bad.append(f"{name}: an element's bits depend on its position (shift {shift})")
        outs.append(full.flatten())
    return bad, torch.cat(outs)


def model(portable: bool) -> tuple[list[str], torch.Tensor]:
    """The tiny Llama (its wrapper enters the mode itself)."""
    from matrix_child import failures, module  # same folder (sys.path[0])

    from detsample.models import HFCausalLM

    toks = torch.randint(0, 512, (12,), generator=_gen(1)).tolist()
    m = HFCausalLM(module("h64-i96-4h"), name="h64", batch_invariant=True, portable=portable)
    bad, full = failures(m, toks)
    return [f"tiny Llama: {b}" for b in bad], full.flatten()


def hybrids(portable: bool) -> tuple[list[str], torch.Tensor]:
    """A gated delta-net hybrid (Qwen3.5) and a Mamba 2 hybrid (Nemotron-H) of the panel:
    prefill == decode == chunked prefill == padded batch through transformers' cache."""
    from architectures import BY_NAME, build, own_cache_failures  # same folder (sys.path[0])

    toks = torch.randint(0, 512, (12,), generator=_gen(2)).tolist()
    bad, outs = [], []
    for name in ("qwen35", "nemotronh"):
        failed, full = own_cache_failures(build(BY_NAME[name]), toks, portable)
        bad += [f"{name}: {b}" for b in failed]
        outs.append(full.flatten())
    return bad, torch.cat(outs)


def _under_mode(check):
    def run(portable: bool) -> tuple[list[str], torch.Tensor]:
        with batch_invariant(portable=portable):
            return check()

    return run


def narrow() -> tuple[list[str], torch.Tensor]:
    """The products only, at the two narrow shapes (the default suite's emulated case)."""
    return products(SHAPES[:2])


CHECKS = {
    "narrow": _under_mode(narrow),
    "products": _under_mode(products),
    "sums": _under_mode(sums),
    "pointwise": _under_mode(pointwise),
    "model": model,
    "hybrids": hybrids,
}


def run(names: list[str]) -> dict:
    out: dict = {"failures": [], "hashes": {}, "isa": torch.backends.cpu.get_cpu_capability()}
    for portable in (False, True):
        variant = "portable" if portable else "verified"
        for threads in (1, 2):
            with torch_threads(threads), torch.no_grad():
                for name in names:
                    bad, values = CHECKS[name](portable)
                    out["failures"] += [f"{variant}, {threads} thread(s): {b}" for b in bad]
                    if portable:
                        digest = hashlib.sha256(values.numpy().tobytes()).hexdigest()[:16]
                        out["hashes"].setdefault(name, set()).add(digest)
    out["hashes"] = {k: sorted(v) for k, v in out["hashes"].items()}
    return out


def main() -> int:
    names = sys.argv[1:] or ["products", "sums", "pointwise"]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        print(f"unknown check(s) {unknown}; choose from {sorted(CHECKS)}", file=sys.stderr)
        return 2
    out = run(names)
    print(json.dumps(out))
    return 0 if not out["failures"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
