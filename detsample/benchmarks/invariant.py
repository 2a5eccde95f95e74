"""The batch-invariant mode against torch's default kernels on real transformers models.

Workloads (docs/performance.md, "Batch-invariant mode"): a prefill of ``prefill_len``
tokens at batch 1, and one decode step at batch ``decode_batch`` over caches of
``cache_len`` tokens, through :class:`~detsample.models.hf.HFCausalLM` (one padded
forward, as the engine runs it). The default side is the model as loaded (SDPA attention,
torch's kernels); the mode side is ``load_model(..., batch_invariant=True)`` (the
``"detsample"`` attention under ``detsample.batch_invariant()``). Both sides alternate
round by round in one process, so a loaded machine slows both alike; each figure is the
best (minimum) wall time over ``rounds``, the least disturbed by other processes. Models: ``hf-tiny-llama`` and ``wide``, a Llama of hidden 1024 and
8 layers (16 heads, 4 KV heads, MLP 2752, the 512-token vocabulary).

Run: ``python -m detsample.benchmarks.invariant [--rounds N] [--threads N]``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from detsample.threads import torch_threads

WIDE = dict(vocab_size=512, hidden_size=1024, intermediate_size=2752, num_hidden_layers=8,
            num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=1024,
            rms_norm_eps=1e-5, tie_word_embeddings=False)
MODELS = ("hf-tiny-llama", "wide")


@dataclass(frozen=True)
class Timing:
    """Best seconds of one workload on both sides, and their ratio (mode / default)."""

    model: str
    workload: str
    default_s: float
    mode_s: float

    @property
    def ratio(self) -> float:
        return self.mode_s / self.default_s


def build(name: str, batch_invariant: bool, seed: int = 0) -> Any:
    """``name`` of :data:`MODELS` as an ``HFCausalLM`` (default kernels or the mode)."""
    from detsample.models import HFCausalLM, load_model
    from detsample.models.tiny import build_hf

    if name == "wide":
        return HFCausalLM(build_hf("llama", seed, **WIDE), name=name,
                          batch_invariant=batch_invariant)
    return load_model(name, seed=seed, batch_invariant=batch_invariant)


def _clone(cache: Any) -> Any:
    out = type(cache)()
    out.token_ids = list(cache.token_ids)
    out.layers = list(cache.layers)   # tensors are replaced, never written, by a forward
    return out


def _best_pair(first: Callable[[], Any], second: Callable[[], Any], rounds: int,
                 setup: Callable[[], Any] = lambda: None) -> tuple[float, float]:
    a, b = [], []
    for _ in range(rounds):
        for fn, acc in ((first, a), (second, b)):
            state = setup()
            t = time.perf_counter()
            fn(state)
            acc.append(time.perf_counter() - t)
    return min(a), min(b)


def measure(name: str, *, prefill_len: int = 512, decode_batch: int = 8, cache_len: int = 256,
            rounds: int = 5, threads: int = 2, seed: int = 0) -> list[Timing]:
    """Prefill and decode timings of model ``name``, default kernels vs the mode."""
    default, mode = build(name, False, seed), build(name, True, seed)
    g = torch.Generator().manual_seed(seed)
    vocab = default.vocab_size
    prompt = torch.randint(0, vocab, (prefill_len,), generator=g).tolist()
    rows = [torch.randint(0, vocab, (cache_len,), generator=g).tolist() for _ in range(decode_batch)]
    step = [[int(t)] for t in torch.randint(0, vocab, (decode_batch,), generator=g)]
    out = []
    with torch_threads(threads):
        caches = {}
        for label, m in (("default", default), ("mode", mode)):
            cs = [m.new_cache() for _ in rows]
            m.forward(cs, rows)                                  # caches, and a warm-up
            m.forward([m.new_cache()], [prompt[:32]])
            caches[label] = cs
        d, b = _best_pair(lambda _: default.forward([default.new_cache()], [prompt]),
                            lambda _: mode.forward([mode.new_cache()], [prompt]), rounds)
        out.append(Timing(name, f"prefill {prefill_len} x 1", d, b))
        fresh = {k: [_clone(c) for c in v] for k, v in caches.items()}
        d, b = _best_pair(lambda s: default.forward(s["default"], step),
                            lambda s: mode.forward(s["mode"], step), rounds,
                            setup=lambda: {k: [_clone(c) for c in v] for k, v in fresh.items()})
        out.append(Timing(name, f"decode {decode_batch} x cache {cache_len}", d, b))
    return out


def table(timings: list[Timing]) -> str:
    """Markdown: model, workload, default ms, mode ms, ratio."""
    lines = ["| model | workload | default kernels (ms) | batch-invariant mode (ms) | ratio |",
             "|---|---|---|---|---|"]
    for t in timings:
        lines.append(f"| {t.model} | {t.workload} | {1e3 * t.default_s:.1f} | "
                     f"{1e3 * t.mode_s:.1f} | {t.ratio:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m detsample.benchmarks.invariant",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    timings = []
    for name in args.models:
        timings += measure(name, rounds=args.rounds, threads=args.threads)
    print(table(timings))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
