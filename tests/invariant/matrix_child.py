"""One cell of the CPU-settings matrix (run by test_portable.py in a fresh process, since MKL
reads MKL_ENABLE_INSTRUCTIONS when it loads): builds Llamas of shapes the project's own
models do not have, runs each under the verified and the portable kernels, and prints one
JSON line: whether prefill == decode == chunked prefill == left/right-padded batch held
bitwise for every model and variant (and a 700-row product's rows under the verified kernels,
whose big tiles a 24-token prompt never reaches), and a hash of each model's portable logits.

    python tests/invariant/matrix_child.py THREADS [SHAPE ...]
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch

from detsample.models import HFCausalLM, prefill
from detsample.models.tiny import build_hf

SHAPES = {
    "h160-i432-5h": dict(hidden_size=160, intermediate_size=432, num_attention_heads=5, num_key_value_heads=5),
    "h64-i96-4h": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2),
}


def module(name: str) -> torch.nn.Module:
    cfg = dict(
        vocab_size=512,
        num_hidden_layers=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        **SHAPES[name],
    )
    return build_hf("llama", 7, **cfg)


def failures(m: HFCausalLM, toks: list[int]) -> tuple[list[str], torch.Tensor]:
    bad = []
    full = prefill(m, toks)
    c = m.new_cache()
    steps = [prefill(m, toks[:1], c)] + [m.forward([c], [[t]])[0] for t in toks[1:]]
    if not torch.equal(torch.cat(steps), full):
        bad.append("decode != prefill")
    c, parts, i = m.new_cache(), [], 0
    for n in (5, 11, 3, 100):
        parts.append(m.forward([c], [toks[i : i + n]])[0])
        i += n
        if i >= len(toks):
            break
    if not torch.equal(torch.cat(parts), full):
        bad.append("chunked != prefill")
    for side in ("left", "right"):
        pm = m.with_padding(side)
        rows = pm.forward([pm.new_cache() for _ in range(3)], [toks[:7], toks, toks[:19]])
        if not torch.equal(rows[1], full):
            bad.append(f"{side}-padded batch != alone")
    return bad, full


def long_product_failures() -> list[str]:
    """A prefill-length product (700 rows = 512 + 128 + 60, K = N = 1024: big tiles where
    they pass their check) row for row against the rows alone, under the verified kernels."""
    import torch.nn.functional as F

    from detsample import batch_invariant

    g = torch.Generator().manual_seed(11)
    w = torch.randn(1024, 1024, generator=g) / 32
    x = torch.randn(700, 1024, generator=g)
    with batch_invariant():
        out = F.linear(x, w)
        bad = [
            r for r in (0, 511, 512, 600, 639, 640, 699) if not torch.equal(out[r : r + 1], F.linear(x[r : r + 1], w))
        ]
    return [f"long product verified: row {r} of 700 != alone" for r in bad]


def main() -> int:
    torch.set_num_threads(int(sys.argv[1]))
    toks = torch.randint(0, 512, (24,), generator=torch.Generator().manual_seed(1)).tolist()
    out = {"failures": [], "hashes": {}}
    for name in sys.argv[2:] or SHAPES:
        mod = module(name)
        for portable in (False, True):
            m = HFCausalLM(mod, name=name, batch_invariant=True, portable=portable)
            bad, full = failures(m, toks)
            out["failures"] += [f"{name} {'portable' if portable else 'verified'}: {b}" for b in bad]
            if portable:
                out["hashes"][name] = hashlib.sha256(full.numpy().tobytes()).hexdigest()[:16]
    out["failures"] += long_product_failures()
    out["isa"] = torch.backends.cpu.get_cpu_capability()
    print(json.dumps(out))
    return 0 if not out["failures"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
