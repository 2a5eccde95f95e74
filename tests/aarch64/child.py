"""The bits tests/aarch64/test_aarch64.py compares, written by one process: run natively
and under aarch64 emulation (ci/aarch64.sh run), each writes its files to OUT and the test
compares the two folders byte for byte. It must not start subprocesses (they would cost
another torch import, ~30 s emulated).

    python tests/aarch64/child.py OUT scenarios [NAME ...]   # the golden scenarios' outputs
    python tests/aarch64/child.py OUT arith                  # detsample.arith on fixed inputs
    python tests/aarch64/child.py OUT invariant [SHAPE]      # the batch-invariant mode's properties

``OUT/result.json``: what ran (``machine``, torch, numba, the ATen capability), seconds per
part, and for ``invariant`` the failures (empty when every property held). Bits go to
``OUT/<part>/<name>.<array>.bin`` (raw little-endian, shape in result.json).

* scenarios: every registered scenario's canonical run (``Scenario.produce``, what the
  goldens record): positions, token ids, logprobs, top logprob counts, ids and values;
* arith: ``exp`` (float32 bit patterns sweeping the whole range, specials, the families of
  ``detsample.testing.tensor``), ``exp64`` and ``log64`` (float64 inputs), ``normalisers``,
  ``log_softmax`` and ``row_max`` of (5, 1031) logits of each family, each under
  ``impl="numba"`` and ``impl="torch"``;
* invariant: a tiny Llama (2 layers, width 64; ``matrix_child.SHAPES``) under the verified
  and the portable kernels at 1 and 2 threads: decode == prefill == chunked prefill ==
  left/right-padded batch, bitwise (the failures); then the same Llama with weights of
  platform-independent bits (:func:`defined_weights_`), whose portable logits are written:
  their bits are defined by detsample's algorithm, so meant to be the same on every CPU.
  The weights of both inits are written too, and the portable mode's elementwise ops and
  the Llama's rotary table on exact inputs (:func:`portable_ops`).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FAMILIES = ("random", "ties", "huge", "neginf", "nan")


def _save(folder: Path, name: str, arrays: dict, shapes: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for key, a in arrays.items():
        a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        a = np.ascontiguousarray(a)
        (folder / f"{name}.{key}.bin").write_bytes(a.astype(a.dtype.newbyteorder("<")).tobytes())
        shapes[f"{name}.{key}"] = [str(a.dtype), list(a.shape)]


def scenarios(out: Path, names: list[str]) -> dict:
    from detsample.golden import registry

    names = names or registry.names()
    shapes, seconds = {}, {}
    for name in names:
        t0 = time.perf_counter()
        o = registry.get(name).produce(device="cpu")
        seconds[name] = round(time.perf_counter() - t0, 2)
        _save(
            out / "scenarios",
            name,
            {
                "positions": o.positions,
                "tokens": o.tokens,
                "logprobs": o.logprobs,
                "top_counts": o.top_counts,
                "top_ids": o.top_ids,
                "top_logprobs": o.top_logprobs,
            },
            shapes,
        )
    return {"names": names, "shapes": shapes, "seconds_each": seconds}


def _float32_sweep() -> torch.Tensor:
    """Every 4099th float32 bit pattern (both signs, subnormals, NaN payloads included) and
    the values exp's range turns on."""
    bits = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    special = np.array(
        [
            0.0,
            -0.0,
            np.inf,
            -np.inf,
            np.nan,
            88.72283,
            88.72284,
            -87.33654,
            -103.97208,
            -103.972084,
            -104.0,
            1e-30,
            -1e-30,
            0.5,
            -0.5,
            1.0,
            -1.0,
        ],
        dtype=np.float32,
    )
    return torch.from_numpy(np.concatenate([bits.view(np.float32), special]))


def arith(out: Path) -> dict:
    from detsample import arith as A
    from detsample.testing import tensor

    shapes: dict = {}
    z = _float32_sweep()
    finite = z[torch.isfinite(z)]
    x64 = torch.cat(
        [
            finite.double() * 0.37,
            torch.tensor(
                [0.0, -0.0, 1e-300, 5e-324, 1e300, float("inf"), float("-inf"), float("nan")], dtype=torch.float64
            ),
        ]
    )
    pos64 = torch.cat(
        [
            finite.double().abs(),
            torch.tensor([0.0, 5e-324, 1e-310, 1.0, 1e308, float("inf"), -1.0, float("nan")], dtype=torch.float64),
        ]
    )
    logits = {f: tensor((5, 1031), torch.float32, seed=17, family=f) for f in FAMILIES}
    for impl in ("numba", "torch"):
        arrays = {
            "exp_sweep": A.exp(z, impl=impl),
            "exp64": A.exp64(x64, impl=impl),
            "log64": A.log64(pos64, impl=impl),
        }
        for fam, x in logits.items():
            arrays[f"exp_{fam}"] = A.exp(x, impl=impl)
            m, g = A.normalisers(x, impl=impl)
            arrays[f"normalisers_m_{fam}"], arrays[f"normalisers_g_{fam}"] = m, g
            arrays[f"log_softmax_{fam}"] = A.log_softmax(x, impl=impl)
            arrays[f"row_max_{fam}"] = A.row_max(x, impl=impl)
        _save(out / "arith", impl, arrays, shapes)
    return {"shapes": shapes}


def defined_weights_(mod: torch.nn.Module, seed: int = 7) -> torch.nn.Module:
    """``mod``'s parameters from :func:`detsample.testing.tensor` (PCG64's raw bits and exact
    arithmetic: one set of bits on every machine), scaled as ``seeded_init_`` scales its
    draws. ``seeded_init_``'s ``torch.randn`` is not platform-independent: its bits depend
    on the ATen kernel (x86 ``default`` vs ``avx2``, aarch64)."""
    from detsample.models.tiny import _STD
    from detsample.testing import tensor

    with torch.no_grad():
        for i, (name, p) in enumerate(mod.named_parameters()):
            r = tensor(tuple(p.shape), torch.float32, seed=seed * 1000 + i, family="random")
            if "norm" in name:
                p.copy_(1.0 + 0.1 * r)
            else:
                kind = (
                    "embed"
                    if "embed" in name
                    else "lm_head"
                    if "lm_head" in name
                    else "bias"
                    if name.endswith("bias")
                    else "proj"
                )
                p.copy_(_STD[kind] * r)
    return mod


def invariant(out: Path, shape: str) -> dict:
    from detsample.models import HFCausalLM, prefill
    from detsample.probe.threads import torch_threads
    from tests.invariant.matrix_child import failures, module

    toks = torch.randint(0, 512, (16,), generator=torch.Generator().manual_seed(1)).tolist()
    mod = module(shape)
    bad, shapes = [], {}
    for portable in (False, True):
        variant = "portable" if portable else "verified"
        for threads in (1, 2):
            with torch_threads(threads), torch.no_grad():
                m = HFCausalLM(mod, name=shape, batch_invariant=True, portable=portable)
                fails, _ = failures(m, toks)
            bad += [f"{variant}, {threads} thread(s): {f}" for f in fails]
    defined = defined_weights_(module(shape))
    for name, mm in (("seeded_init", mod), ("defined", defined)):
        _save(
            out / "invariant",
            f"weights_{name}",
            {"all": torch.cat([p.detach().flatten() for p in mm.parameters()])},
            shapes,
        )
    for threads in (1, 2):
        with torch_threads(threads), torch.no_grad():
            m = HFCausalLM(defined, name=shape, batch_invariant=True, portable=True)
            _save(out / "invariant", f"portable_logits_{threads}t", {"logits": prefill(m, toks)}, shapes)
    _save(out / "invariant", "ops", portable_ops(defined), shapes)
    return {"failures": bad, "tokens": toks, "shape": shape, "shapes": shapes}


#: elementwise ops a decoder runs, on exact inputs (k / 512 for |k| <= 4096), under the
#: portable mode: where the portable logits differ between CPUs, these say which op's bits did
POINTWISE = {
    "exp": torch.exp,
    "log": lambda x: torch.log(x.abs() + 0.125),
    "silu": torch.nn.functional.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.125),
    "sqrt": lambda x: torch.sqrt(x.abs()),
    "cos": torch.cos,
    "sin": torch.sin,
    "softmax": lambda x: torch.softmax(x.view(16, -1), -1),
    "pow": lambda x: torch.pow(10000.0, x.abs() / 8),
}


def portable_ops(mod: torch.nn.Module) -> dict:
    """POINTWISE's outputs and the Llama's rotary table (cos, sin) under the portable mode."""
    from detsample import batch_invariant

    x = torch.from_numpy(np.arange(-4096, 4096, dtype=np.float32) / np.float32(512))
    pos = torch.arange(64).unsqueeze(0)
    with batch_invariant(portable=True), torch.no_grad():
        outs = {name: f(x) for name, f in POINTWISE.items()}
        cos, sin = mod.model.rotary_emb(x.view(1, 1, -1)[..., :64], pos)
    return {**outs, "rotary_cos": cos, "rotary_sin": sin}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in ("scenarios", "arith", "invariant"):
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    import numba

    t0 = time.perf_counter()
    if argv[1] == "scenarios":
        res = scenarios(out, argv[2:])
    elif argv[1] == "arith":
        res = arith(out)
    else:
        res = invariant(out, argv[2] if len(argv) > 2 else "h64-i96-4h")
    res.update(
        machine=platform.machine(),
        torch=torch.__version__,
        numba=numba.__version__,
        isa=torch.backends.cpu.get_cpu_capability(),
        threads=torch.get_num_threads(),
        seconds=round(time.perf_counter() - t0, 1),
    )
    (out / "result.json").write_text(json.dumps(res, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
