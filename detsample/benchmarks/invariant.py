"""The batch-invariant mode against torch's default kernels on real transformers models.

Workloads (docs/performance.md, "Batch-invariant mode"): a prefill of ``prefill_len``
tokens at batch 1, and one decode step at batch ``decode_batch`` over caches of
``cache_len`` tokens, through :class:`~detsample.models.hf.HFCausalLM` (one padded
forward, as the engine runs it). Three sides: ``default`` (the model as loaded: SDPA
attention, torch's kernels), ``verified`` (``load_model(..., batch_invariant=True)``: the
``"detsample"`` attention and the verified kernels) and ``portable``
(``batch_invariant=True, portable=True``). The sides alternate round by round in one
process, so a loaded machine slows them alike; each figure is the best (minimum) wall time
over ``rounds``, the least disturbed by other processes; the one-time verification is
done by a warm-up before the rounds. Models: ``hf-tiny-llama`` and ``wide``, a Llama of
hidden 1024 and 8 layers (16 heads, 4 KV heads, MLP 2752, the 512-token vocabulary);
``moe`` and ``mla`` (:data:`MOE`, :data:`MLA`); ``real``, a real trained model's shapes
(:data:`REAL`: 135M parameters, hidden 576, 30 layers, 9 / 3 heads, 49,152 tokens) with
massive activations; ``hybrid``, an LFM2 short-convolution
hybrid of the same width (:data:`HYBRID`), and ``ssm``, a Nemotron-H Mamba 2 hybrid
(:data:`SSM`), and ``minimax``, a MiniMax lightning-attention hybrid (:data:`MINIMAX`), run
through transformers' own cache; ``qwen35``, a Qwen3.5-style gated delta-net hybrid
(:data:`QWEN35`) through the adapter.

:func:`verification_cost` times the on-machine checks for the product shapes of a
1B-parameter Llama (Llama 3.2 1B: hidden 2048, MLP 8192, 32 / 8 heads of 64, 128,256-token
vocabulary), from an empty plan registry.

Run: ``python -m detsample.benchmarks.invariant [--rounds N] [--threads N] [--verification]``;
``--breakdown SIDE``: where one prefill's time goes on that side (torch's profiler, per op).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from detsample.probe.threads import torch_threads

WIDE = dict(
    vocab_size=512,
    hidden_size=1024,
    intermediate_size=2752,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
#: a small MoE: 8 experts, top-2, hidden 512, 4 layers (Qwen3-MoE)
MOE = dict(
    vocab_size=512,
    hidden_size=512,
    intermediate_size=1024,
    moe_intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    num_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=1024,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
#: a small MLA model: DeepSeek-V3 attention (q/kv low-rank, qk 96 = 64 + 32 rope, v 64),
#: dense MLPs (every layer below first_k_dense_replace), hidden 512, 4 layers
MLA = dict(
    vocab_size=512,
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=8,
    q_lora_rank=256,
    kv_lora_rank=128,
    qk_rope_head_dim=32,
    qk_nope_head_dim=64,
    v_head_dim=64,
    first_k_dense_replace=4,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=256,
    max_position_embeddings=1024,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
#: a short-convolution hybrid (LFM2): hidden 1024, 8 layers, 5 short convolutions (K 3)
#: and 3 attention layers; run through transformers' own cache (:func:`measure_hybrid`)
HYBRID = dict(
    vocab_size=512,
    hidden_size=1024,
    intermediate_size=2752,
    block_ff_dim=2752,
    block_auto_adjust_ff_dim=False,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=1024,
    layer_types=["conv", "conv", "full_attention"] * 2 + ["conv", "full_attention"],
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
#: a Mamba 2 hybrid (Nemotron-H): hidden 1024, 8 blocks (3 Mamba 2 mixers of 32 heads of
#: 64, state 128, 8 groups; 1 attention; 4 MLPs); run through transformers' own cache
SSM = dict(
    vocab_size=512,
    hidden_size=1024,
    intermediate_size=2752,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
    layers_block_type=["mamba", "mlp", "mamba", "mlp", "attention", "mlp", "mamba", "mlp"],
    mamba_num_heads=32,
    mamba_head_dim=64,
    ssm_state_size=128,
    n_groups=8,
    chunk_size=128,
    max_position_embeddings=8192,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
#: a MiniMax lightning-attention hybrid: hidden 512, 4 layers (3 lightning attention of 8
#: heads of 64, 1 full attention), 4 experts of 2 a token; run through transformers' own
#: cache (MiniMaxCache holds the linear states)
MINIMAX = dict(
    vocab_size=512,
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    num_local_experts=4,
    num_experts_per_tok=2,
    block_size=256,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    max_position_embeddings=8192,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
#: the models run through transformers' own cache: name -> (config class, model class)
OWN_CACHE = {
    "hybrid": ("Lfm2Config", "Lfm2ForCausalLM"),
    "ssm": ("NemotronHConfig", "NemotronHForCausalLM"),
    "minimax": ("MiniMaxConfig", "MiniMaxForCausalLM"),
}
#: a Qwen3.5-style gated delta-net hybrid: hidden 512, 4 layers (3 gated delta-net, 1 full
#: attention, Qwen3.5's 3:1 pattern), 8 value / 4 key heads of 64 in the linear layers;
#: through detsample's adapter (its per-row states). Under the mode a gated delta-net
#: prefill is T recurrent steps (detsample/invariant/mixers.py): its cost grows with T
QWEN35 = dict(
    vocab_size=512,
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_value_heads=8,
    linear_num_key_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    max_position_embeddings=8192,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
#: a real trained model's shapes (a 135M-parameter Llama: SmolLM-135M's config), seeded
#: weights with massive activations as the accuracy benchmark makes them (residual
#: channels 5 and 77 at :data:`REAL_MASSIVE` x the rest)
REAL = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)
REAL_MASSIVE = 300.0
MODELS = ("hf-tiny-llama", "wide", "moe", "mla", "hybrid", "ssm", "qwen35", "minimax", "real")


SIDES = ("default", "verified", "portable")
#: what :func:`breakdown` profiles: a prefill, or one decode step
WORKLOADS = ("prefill", "decode")


@dataclass(frozen=True)
class Timing:
    """Best wall seconds of one workload per side, the process CPU seconds of that same
    round (all threads; None where not measured), and the ratios to the default side."""

    model: str
    workload: str
    seconds: dict
    cpu: dict | None = None

    def ratio(self, side: str) -> float:
        return self.seconds[side] / self.seconds["default"]

    def cpu_ratio(self, side: str) -> float:
        return self.cpu[side] / self.cpu["default"]


def build(name: str, side: str, seed: int = 0) -> Any:
    """``name`` of :data:`MODELS` as an ``HFCausalLM`` on ``side`` (one of :data:`SIDES`)."""
    from detsample.models import HFCausalLM, load_model
    from detsample.models.tiny import build_hf

    mode = dict(batch_invariant=side != "default", portable=side == "portable")
    if name == "wide":
        return HFCausalLM(build_hf("llama", seed, **WIDE), name=name, **mode)
    if name == "real":
        from detsample.benchmarks.accuracy import make_massive_

        return HFCausalLM(make_massive_(build_hf("llama", seed, **REAL), REAL_MASSIVE), name=name, **mode)
    if name in ARCHS:
        return HFCausalLM(_build_arch(name, seed), name=name, **mode)
    return load_model(name, seed=seed, **mode)


#: the models of :data:`MODELS` built from a transformers config: (config, model, kwargs)
ARCHS = {
    "moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", MOE),
    "mla": ("DeepseekV3Config", "DeepseekV3ForCausalLM", MLA),
    "qwen35": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", QWEN35),
}


def _build_arch(name: str, seed: int) -> Any:
    import transformers

    from detsample.models.tiny import seeded_init_

    cfg_cls, model_cls, cfg = ARCHS[name]
    with torch.random.fork_rng(devices=[]):
        model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**cfg))
    return seeded_init_(model, seed).eval()


def _clone(cache: Any) -> Any:
    out = type(cache)()
    out.token_ids = list(cache.token_ids)
    out.layers = list(cache.layers)  # tensors are replaced, never written, by a forward
    out.states = dict(getattr(cache, "states", {}))  # likewise (stacked into a new batch)
    return out


def _best(
    fns: dict[str, Callable[[Any], Any]], rounds: int, setup: Callable[[], Any] = lambda: None
) -> tuple[dict[str, float], dict[str, float]]:
    """The best wall seconds of each side over ``rounds`` alternating rounds, and the
    process CPU seconds of each side's best round."""
    best = {k: float("inf") for k in fns}
    cpu = {k: float("nan") for k in fns}
    for _ in range(rounds):
        for side, fn in fns.items():
            state = setup()
            t, c = time.perf_counter(), time.process_time()
            fn(state)
            wall = time.perf_counter() - t
            if wall < best[side]:
                best[side], cpu[side] = wall, time.process_time() - c
    return best, cpu


def measure(
    name: str,
    *,
    prefill_len: int = 512,
    decode_batch: int = 8,
    cache_len: int = 256,
    rounds: int = 5,
    threads: int = 2,
    seed: int = 0,
    sides: tuple[str, ...] = SIDES,
) -> list[Timing]:
    """Prefill and decode timings of model ``name`` on each side."""
    models = {side: build(name, side, seed) for side in sides}
    prompt, rows, step = _adapter_ids(models[sides[0]].vocab_size, (prefill_len, decode_batch, cache_len), seed)
    out = []
    with torch_threads(threads):
        caches = {}
        for side, m in models.items():
            cs = [m.new_cache() for _ in rows]
            m.forward(cs, rows)  # caches, and a warm-up
            m.forward([m.new_cache()], [prompt])  # (verifies every shape)
            m.forward([_clone(c) for c in cs], step)
            caches[side] = cs
        best = _best(
            {side: (lambda _, m=m: m.forward([m.new_cache()], [prompt])) for side, m in models.items()}, rounds
        )
        out.append(Timing(name, f"prefill {prefill_len} x 1", *best))
        best = _best(
            {side: (lambda s, side=side, m=m: m.forward(s[side], step)) for side, m in models.items()},
            rounds,
            setup=lambda: {k: [_clone(c) for c in v] for k, v in caches.items()},
        )
        out.append(Timing(name, f"decode {decode_batch} x cache {cache_len}", *best))
    return out


def _adapter_ids(vocab: int, sizes: tuple[int, int, int], seed: int) -> tuple[list, list, list]:
    """The token ids of :func:`measure`'s workloads through the adapter, ``sizes`` =
    ``(prefill_len, decode_batch, cache_len)``: a prompt, the decode rows' cached tokens,
    their next tokens (one list each, as ``HFCausalLM.forward`` takes them)."""
    prefill_len, decode_batch, cache_len = sizes
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (prefill_len,), generator=g).tolist()
    rows = [torch.randint(0, vocab, (cache_len,), generator=g).tolist() for _ in range(decode_batch)]
    step = [[int(t)] for t in torch.randint(0, vocab, (decode_batch,), generator=g)]
    return prompt, rows, step


def _own_cache_ids(name: str, sizes: tuple[int, int, int], seed: int) -> tuple[torch.Tensor, ...]:
    """:func:`_adapter_ids` for the :data:`OWN_CACHE` hybrids, as transformers takes them:
    a (1, prefill_len) prompt, (decode_batch, cache_len) rows, (decode_batch, 1) next
    tokens (ids from 3: past the special tokens)."""
    prefill_len, decode_batch, cache_len = sizes
    g = torch.Generator().manual_seed(seed)
    vocab = _config(name)["vocab_size"]
    prompt = torch.randint(3, vocab, (1, prefill_len), generator=g)
    rows = torch.randint(3, vocab, (decode_batch, cache_len), generator=g)
    step = torch.randint(3, vocab, (decode_batch, 1), generator=g)
    return prompt, rows, step


def _hybrid_side(side: str, seed: int, name: str = "hybrid") -> Callable[..., Any]:
    """The hybrid ``name`` of :data:`OWN_CACHE` called as transformers runs it (its own
    cache), on ``side``."""
    import transformers

    from detsample.invariant import batch_invariant
    from detsample.models.hf import use_invariant_attention
    from detsample.models.tiny import seeded_init_

    config, cls = OWN_CACHE[name]
    with torch.random.fork_rng(devices=[]):
        model = getattr(transformers, cls)(getattr(transformers, config)(**_config(name)))
    model = seeded_init_(model, seed).eval()
    if side != "default":
        use_invariant_attention(model)

    def call(*args: Any, **kwargs: Any) -> Any:
        mode = batch_invariant(portable=side == "portable") if side != "default" else None
        with torch.no_grad():
            if mode is None:
                return model(*args, **kwargs)
            with mode:
                return model(*args, **kwargs)

    return call


def _config(name: str) -> dict:
    return {"hybrid": HYBRID, "ssm": SSM, "minimax": MINIMAX}[name]


def measure_model(name: str, **kw: Any) -> list[Timing]:
    """:func:`measure` of any model of :data:`MODELS`: the :data:`OWN_CACHE` hybrids through
    transformers' own cache (:func:`measure_hybrid`), the others through the adapter."""
    return measure_hybrid(name=name, **kw) if name in OWN_CACHE else measure(name, **kw)


def measure_hybrid(
    *,
    prefill_len: int = 512,
    decode_batch: int = 8,
    cache_len: int = 256,
    rounds: int = 5,
    threads: int = 2,
    seed: int = 0,
    sides: tuple[str, ...] = SIDES,
    name: str = "hybrid",
) -> list[Timing]:
    """:func:`measure`'s workloads on the hybrid ``name`` (:data:`OWN_CACHE`: LFM2, or the
    Nemotron-H Mamba 2 hybrid) through transformers' own cache (detsample's adapter carries
    keys and values only): the decode batch is ``decode_batch`` rows of ``cache_len``
    tokens prefilled together, then one step (the cache copied, not timed, before each
    round: a step writes its convolution windows and recurrent states in place)."""
    import copy

    calls = {side: _hybrid_side(side, seed, name) for side in sides}
    prompt, rows, step = _own_cache_ids(name, (prefill_len, decode_batch, cache_len), seed)
    with torch_threads(threads):
        caches = {}
        for side, call in calls.items():
            caches[side] = call(rows, use_cache=True).past_key_values  # and a warm-up
            call(prompt)
            call(step, past_key_values=copy.deepcopy(caches[side]), use_cache=True)
        pre = _best({side: (lambda _, c=c: c(prompt)) for side, c in calls.items()}, rounds)
        dec = _best(
            {
                side: (lambda s, side=side, c=c: c(step, past_key_values=s[side], use_cache=True))
                for side, c in calls.items()
            },
            rounds,
            setup=lambda: {k: copy.deepcopy(v) for k, v in caches.items()},
        )
    return [
        Timing(name, f"prefill {prefill_len} x 1", *pre),
        Timing(name, f"decode {decode_batch} x cache {cache_len}", *dec),
    ]


def table(timings: list[Timing]) -> str:
    """Markdown: model, workload, wall ms per side, ratios to the default kernels, and
    (where measured) the CPU ratios of the same rounds."""
    sides = [s for s in SIDES if s in timings[0].seconds]
    cpu = all(t.cpu is not None for t in timings)
    lines = [
        "| model | workload | "
        + " | ".join(f"{s} (ms)" for s in sides)
        + " | "
        + " | ".join(f"{s} / default" for s in sides[1:])
        + "".join(f" | CPU {s} / default" for s in sides[1:] if cpu)
        + " |",
        "|---|---|" + "---|" * (len(sides) + (len(sides) - 1) * (1 + cpu)),
    ]
    for t in timings:
        lines.append(
            f"| {t.model} | {t.workload} | "
            + " | ".join(f"{1e3 * t.seconds[s]:.1f}" for s in sides)
            + " | "
            + " | ".join(f"{t.ratio(s):.2f}x" for s in sides[1:])
            + "".join(f" | {t.cpu_ratio(s):.2f}x" for s in sides[1:] if cpu)
            + " |"
        )
    return "\n".join(lines)


def breakdown(
    name: str,
    side: str,
    *,
    workload: str = "prefill",
    prefill_len: int = 512,
    decode_batch: int = 8,
    cache_len: int = 256,
    threads: int = 2,
    top: int = 12,
) -> list[tuple[str, float, float]]:
    """Where one forward's time goes on ``side``: ``(op, ms, share)`` for the ``top`` ops
    by self CPU time (torch's profiler, after a warm-up): a prefill of ``prefill_len``
    tokens (``workload`` "prefill") or one decode step of ``decode_batch`` rows over
    caches of ``cache_len`` tokens ("decode"), the workloads of :func:`measure`."""
    from torch.profiler import ProfilerActivity, profile

    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, got {workload!r}")
    if name in OWN_CACHE:
        with torch_threads(threads):
            run = _own_cache_run(name, side, workload, (prefill_len, decode_batch, cache_len))
            run()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run()
        return _top_ops(prof, top)
    m = build(name, side)
    prompt, rows, step = _adapter_ids(m.vocab_size, (prefill_len, decode_batch, cache_len), 0)
    with torch_threads(threads):
        if workload == "prefill":
            run = lambda: m.forward([m.new_cache()], [prompt])  # noqa: E731
        else:
            caches = [m.new_cache() for _ in rows]
            m.forward(caches, rows)
            run = lambda: m.forward([_clone(c) for c in caches], step)  # noqa: E731
        run()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
    return _top_ops(prof, top)


def _top_ops(prof: Any, top: int) -> list[tuple[str, float, float]]:
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    return [(e.key, e.self_cpu_time_total / 1e3, e.self_cpu_time_total / total) for e in events[:top]]


def _own_cache_run(name: str, side: str, workload: str, sizes: tuple[int, int, int]) -> Callable[[], Any]:
    """:func:`breakdown`'s forward of an :data:`OWN_CACHE` hybrid (transformers' own
    cache, as :func:`measure_hybrid` runs it), to be called twice (a warm-up, then the
    profiled call): a prefill, or a decode step from a fresh copy of the prefilled cache
    (copied before, not inside, each call); :func:`measure_hybrid`'s inputs."""
    import copy

    call = _hybrid_side(side, 0, name)
    prompt, rows, step = _own_cache_ids(name, sizes, 0)
    if workload == "prefill":
        return lambda: call(prompt)
    cache = call(rows, use_cache=True).past_key_values
    copies = [copy.deepcopy(cache) for _ in range(2)]
    return lambda: call(step, past_key_values=copies.pop(), use_cache=True)


#: (K, N) of every product of a Llama 3.2 1B forward: q/o, k/v, gate/up, down, lm_head
#: (the 8192- and 128256-wide outputs run in 4096-column blocks, 128256 = 31 * 4096 + 1280)
LLAMA_1B_PRODUCTS = ((2048, 2048), (2048, 512), (2048, 4096), (8192, 2048), (2048, 1280))
#: the invariant attention's two batched products at head dim 64: scores, values (+1 column)
LLAMA_1B_ATTENTION = ((64, 128, "nt"), (128, 65, "nn"))


def verification_cost(threads: int = 2) -> tuple[float, list[tuple[str, float, str]]]:
    """Seconds the on-machine checks take for a 1B Llama's product shapes (weights in
    ``F.linear``'s transposed layout), from an empty registry; and per shape (label,
    seconds, the kernel chosen)."""
    from detsample.invariant import state, verify

    state.reset_plans()
    rows = []
    with torch_threads(threads):
        t0 = time.perf_counter()
        for k, n in LLAMA_1B_PRODUCTS:
            t = time.perf_counter()
            plan = verify.matmul_plan("mm", k, n, "nt", torch.float32)
            rows.append((f"mm K={k} N={n}", time.perf_counter() - t, plan.kernel))
        for k, n, lay in LLAMA_1B_ATTENTION:
            t = time.perf_counter()
            plan = verify.matmul_plan("bmm", k, n, lay, torch.float32)
            rows.append((f"bmm K={k} N={n} {lay}", time.perf_counter() - t, plan.kernel))
        total = time.perf_counter() - t0
    state.reset_plans()
    return total, rows


def big_tile_cost(threads: int = 2) -> tuple[float, list[tuple[str, float, str]]]:
    """Seconds the big-tile checks take for a 1B Llama's product shapes (paid once, at the
    first call of each shape with at least 128 rows: the first long prefill), after their
    verification; and per shape (label, seconds, the big tiles taken)."""
    from detsample.invariant import state, verify

    state.reset_plans()
    rows = []
    with torch_threads(threads):
        total = 0.0
        for k, n in LLAMA_1B_PRODUCTS:
            canon = verify.matmul_plan("mm", k, n, "nt", torch.float32)
            t = time.perf_counter()
            plan = verify.big_plan(k, n, "nt", torch.float32, canon)
            rows.append((f"mm K={k} N={n}", time.perf_counter() - t, plan.kernel))
            total += rows[-1][1]
    state.reset_plans()
    return total, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m detsample.benchmarks.invariant", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--decode-batch",
        type=int,
        nargs="+",
        default=[8],
        help="decode batch sizes (one decode workload each; default 8)",
    )
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    p.add_argument(
        "--prefill-len",
        type=int,
        default=512,
        help="prompt length of the prefill workload (default 512; 4096: a long prompt)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--breakdown",
        choices=SIDES,
        default=None,
        help="only profile one forward of each model on this side (--workload): time per op",
    )
    p.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="prefill",
        help="what --breakdown profiles: a prefill of --prefill-len, or one decode step of "
        "the first --decode-batch rows over 256-token caches (default prefill)",
    )
    p.add_argument(
        "--verification", action="store_true", help="only time the on-machine checks for a 1B Llama's shapes"
    )
    args = p.parse_args(argv)
    if args.prefill_len < 1:
        p.error(f"--prefill-len must be >= 1, got {args.prefill_len}")
    if args.verification:
        total, rows = verification_cost(args.threads)
        for label, sec, kernel in rows:
            print(f"{label:<22} {1e3 * sec:8.1f} ms  {kernel}")
        print(f"total {total:.2f} s")
        total, rows = big_tile_cost(args.threads)
        print("big-tile checks (once, at the first call of a shape with >= 128 rows):")
        for label, sec, kernel in rows:
            print(f"{label:<22} {1e3 * sec:8.1f} ms  {kernel}")
        print(f"total {total:.2f} s")
        return 0
    if args.breakdown:
        for name in args.models:
            what = (
                f"one prefill of {args.prefill_len}"
                if args.workload == "prefill"
                else f"one decode step of {args.decode_batch[0]} x cache 256"
            )
            print(f"{name}, {args.breakdown}: self CPU time per op, {what}")
            rows = breakdown(
                name,
                args.breakdown,
                workload=args.workload,
                prefill_len=args.prefill_len,
                decode_batch=args.decode_batch[0],
                threads=args.threads,
            )
            for op, ms, share in rows:
                print(f"  {op:<40} {ms:9.1f} ms  {100 * share:5.1f}%")
        return 0
    timings = []
    sides = tuple(s for s in SIDES if s in args.sides or s == "default")
    for name in args.models:
        for k, batch in enumerate(args.decode_batch):
            got = measure_model(
                name,
                rounds=args.rounds,
                threads=args.threads,
                decode_batch=batch,
                sides=sides,
                prefill_len=args.prefill_len,
            )
            timings += got if k == 0 else got[1:]  # the prefill once
    print(table(timings))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
