"""The invariant-mode benchmark's plumbing (detsample/benchmarks/invariant.py), on sizes
small enough for the default suite.

Pins: a benchmark that times the wrong side (two sides on the same kernels, or a cache
that grows between rounds), whose table drops a workload or a side, and a verification
timer that leaves its decisions behind.
"""

from __future__ import annotations

import pytest
import torch

from detsample.benchmarks.invariant import SIDES, build, measure, table
from detsample.invariant import state


def test_each_side_is_timed_with_its_own_kernels():
    models = {side: build("hf-tiny-llama", side) for side in SIDES}
    assert not models["default"].batch_invariant
    assert models["verified"].batch_invariant and not models["verified"].portable
    assert models["portable"].batch_invariant and models["portable"].portable
    timings = measure("hf-tiny-llama", prefill_len=6, decode_batch=2, cache_len=5, rounds=1, threads=1)
    assert [t.workload for t in timings] == ["prefill 6 x 1", "decode 2 x cache 5"]
    assert all(set(t.seconds) == set(SIDES) and min(t.seconds.values()) > 0 for t in timings)
    text = table(timings)
    assert text.count("\n") == 3 and "hf-tiny-llama" in text and "portable / default" in text


def test_verification_cost_starts_and_ends_with_an_empty_registry(monkeypatch):
    from detsample.benchmarks import invariant as bench

    monkeypatch.setattr(bench, "LLAMA_1B_PRODUCTS", ((64, 32),))
    monkeypatch.setattr(bench, "LLAMA_1B_ATTENTION", ((16, 32, "nt"),))
    state.plans().get(("marker",), lambda: state.Plan("x", state.VERIFIED, "y"))
    total, rows = bench.verification_cost(threads=1)
    assert total > 0 and [r[0] for r in rows] == ["mm K=64 N=32", "bmm K=16 N=32 nt"]
    assert not dict(state.plans().items())


_SMALL = {
    "hybrid": (
        "HYBRID",
        dict(
            hidden_size=64,
            intermediate_size=96,
            block_ff_dim=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            layer_types=["conv", "full_attention"],
        ),
    ),
    "ssm": (
        "SSM",
        dict(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            layers_block_type=["mamba", "attention"],
            mamba_num_heads=4,
            mamba_head_dim=16,
            ssm_state_size=16,
            n_groups=1,
            chunk_size=8,
        ),
    ),
    "minimax": (
        "MINIMAX",
        dict(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            block_size=4,
            layer_types=["linear_attention", "full_attention"],
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(_SMALL))
def test_the_hybrid_runs_each_side_through_its_own_cache(monkeypatch, name):
    from detsample.benchmarks import invariant as bench

    attr, small = _SMALL[name]
    monkeypatch.setattr(bench, attr, dict(getattr(bench, attr), **small))
    with state.plans().recording() as used:
        timings = bench.measure_hybrid(prefill_len=6, decode_batch=2, cache_len=5, rounds=2, threads=1, name=name)
    assert [t.workload for t in timings] == ["prefill 6 x 1", "decode 2 x cache 5"]
    assert all(set(t.seconds) == set(SIDES) and min(t.seconds.values()) > 0 for t in timings)
    assert any(p.portable for k, p in state.plans().items() if k in used)  # the portable side ran


def test_the_gated_delta_net_hybrid_runs_through_the_adapter(monkeypatch):
    """The Qwen3.5-style row: HFCausalLM carrying per-row states; each decode round from
    the same cached states (a clone's forward replaces, never writes, the states)."""
    from detsample.benchmarks import invariant as bench

    small = dict(
        bench.QWEN35,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        head_dim=16,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
    )
    monkeypatch.setitem(bench.ARCHS, "qwen35", (*bench.ARCHS["qwen35"][:2], small))
    m = build("qwen35", "verified")
    c = m.new_cache()
    m.forward([c], [[5, 6, 7]])
    before = {k: v.clone() for k, v in c.states[0]["recurrent_states"].items()}
    m.forward([bench._clone(c)], [[8]])
    assert len(c) == 3 and all(torch.equal(c.states[0]["recurrent_states"][k], v) for k, v in before.items())
    timings = measure("qwen35", prefill_len=6, decode_batch=2, cache_len=5, rounds=1, threads=1)
    assert [t.workload for t in timings] == ["prefill 6 x 1", "decode 2 x cache 5"]
    assert all(set(t.seconds) == set(SIDES) and min(t.seconds.values()) > 0 for t in timings)


def test_the_real_shape_model_has_massive_activations_and_cpu_times(monkeypatch):
    """The real trained model's row (a 135M Llama's shapes, shrunk here): its massive
    residual channels are there, and every timing carries the CPU time of its round."""
    from detsample.benchmarks import accuracy
    from detsample.benchmarks import invariant as bench

    monkeypatch.setattr(
        bench, "REAL", dict(bench.REAL, vocab_size=256, num_hidden_layers=2, hidden_size=144, intermediate_size=128)
    )
    m = build("real", "default")
    w = m.module.model.layers[0].mlp.down_proj.weight
    rest = w.abs().mean(dim=1)
    for ch in accuracy.CHANNELS:
        assert rest[ch] > 50 * rest.median()
    timings = measure("real", prefill_len=6, decode_batch=2, cache_len=5, rounds=1, threads=1)
    assert all(t.cpu is not None and set(t.cpu) == set(SIDES) and t.cpu["default"] > 0 for t in timings)
    assert "CPU portable / default" in table(timings)


@pytest.mark.parametrize("workload", ["prefill", "decode"])
def test_the_breakdown_profiles_the_workload_it_names(workload, capsys):
    """Bug pinned: --breakdown profiled a prefill of 512 whatever --prefill-len said, and
    never a decode step (where a rollout spends its time)."""
    from detsample.benchmarks import invariant as bench

    rows = bench.breakdown(
        "hf-tiny-llama", "verified", workload=workload, prefill_len=7, decode_batch=3, cache_len=5, threads=1
    )
    assert rows and all(ms >= 0 and 0 <= share <= 1 for _, ms, share in rows)
    assert any(op == "aten::mm" for op, _, _ in rows)  # the mode's products ran
    argv = ["--models", "hf-tiny-llama", "--breakdown", "verified", "--workload", workload, "--prefill-len", "7"]
    assert bench.main([*argv, "--decode-batch", "3"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.endswith("one prefill of 7" if workload == "prefill" else "one decode step of 3 x cache 256")
    with pytest.raises(ValueError, match="workload must be one of"):
        bench.breakdown("hf-tiny-llama", "verified", workload="train")


@pytest.mark.parametrize("workload", ["prefill", "decode"])
def test_the_breakdown_runs_the_own_cache_hybrids(monkeypatch, workload):
    """Bug pinned: --breakdown of a hybrid run through transformers' own cache (LFM2,
    Nemotron-H, MiniMax) asked the adapter's model loader for it and died with a
    traceback (unknown model 'ssm')."""
    from detsample.benchmarks import invariant as bench

    attr, small = _SMALL["ssm"]
    monkeypatch.setattr(bench, attr, dict(getattr(bench, attr), **small))
    rows = bench.breakdown("ssm", "verified", workload=workload, prefill_len=6, decode_batch=2, cache_len=5, threads=1)
    assert rows and any(op == "aten::mm" for op, _, _ in rows)
