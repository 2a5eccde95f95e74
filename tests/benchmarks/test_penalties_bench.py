"""Opt-in benchmark of penalties: ``pytest tests/benchmarks -m bench
--benchmark-enable -k penalties``; ``python -m tests.benchmarks.test_penalties_bench`` prints
the markdown table of docs/perf/penalties.md.

B=64, V=152064, temperature 0.8; half the rows (the odd ones) carry frequency 0.5,
presence 0.3 and repetition 1.2 over a 512-token prompt and 256 earlier output tokens.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from detsample import Request, Sampler, SamplingBatch, SamplingParams
from detsample.benchmarks import sampler as bm
from detsample.ops import penalties as pen_ops
from detsample.processors.penalties import apply_penalties_and_constraints

B, V, PROMPT, OUTPUT = 64, 152064, 512, 256
PEN = dict(frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.2)


def _setup(penalties: bool):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, V, generator=g) * 3
    toks = torch.randint(0, V, (B, PROMPT + OUTPUT), generator=g).tolist()
    reqs = [
        Request(
            f"r{i}",
            SamplingParams(seed=i, temperature=0.8, **(PEN if penalties and i % 2 else {})),
            toks[i][:PROMPT],
            toks[i][PROMPT:],
        )
        for i in range(B)
    ]
    batch = SamplingBatch.from_requests(reqs, V)
    pos = torch.full((B,), PROMPT + OUTPUT, dtype=torch.int64)
    return logits, batch, pos


def _dense_state(batch):
    """The vLLM layout for the same rows: (n, V) counts and seen masks."""
    rows = [i for i, r in enumerate(batch.requests) if r.params.has_penalties]
    n = len(rows)
    counts = torch.zeros((n, V), dtype=torch.int32)
    seen = torch.zeros((n, V), dtype=torch.bool)
    for j, i in enumerate(rows):
        out = torch.tensor(batch.output_ids[i])
        counts[j].index_add_(0, out, torch.ones_like(out, dtype=torch.int32))
        seen[j, torch.tensor(batch.requests[i].prompt_ids)] = True
        seen[j, out] = True
    col = lambda v: torch.full((n, 1), v, dtype=torch.float32)  # noqa: E731
    idx = torch.tensor(rows)
    return idx, counts, seen, col(0.5), col(0.3), col(1.2)


def paths():
    lg0, b0, pos = _setup(False)
    lg1, b1, _ = _setup(True)
    s0, s1 = Sampler(), Sampler()
    dense = _dense_state(b1)
    toks = torch.randint(0, V, (B,), generator=torch.Generator().manual_seed(1))

    def dense_penalties():
        idx, counts, seen, f, p, r = dense
        x = lg1.clone()
        sub = x.index_select(0, idx)
        pen_ops.apply_penalties_dense_(sub, counts, seen, f, p, r)
        x.index_copy_(0, idx, sub)
        return x

    def dense_advance():
        idx, counts = dense[0], dense[1]
        counts.index_put_((torch.arange(len(idx)), toks[idx]), torch.ones(len(idx), dtype=torch.int32), accumulate=True)

    scratch = torch.empty_like(lg1)

    def sparse_penalties():
        b1.penalties._coo = None  # rebuild the COO view as after an advance
        return apply_penalties_and_constraints(lg1, b1, lambda: scratch)

    tl = toks.tolist()

    return {
        "deterministic step, no penalties": lambda: s0.sample(lg0, b0, pos),
        "deterministic step, penalties on 32/64 rows": lambda: s1.sample(lg1, b1, pos),
        "step 3 alone, sparse (COO rebuilt)": sparse_penalties,
        "step 3 alone, dense (n, V) layout": dense_penalties,
        "copy of the logits into scratch (part of step 3)": lambda: scratch.copy_(lg1),
        "batch.advance, penalties on 32/64 rows": lambda: b1.advance(tl),
        "batch.advance, no penalties": lambda: b0.advance(tl),
        "dense counts update (vLLM layout, for comparison)": dense_advance,
    }


@pytest.mark.bench
@pytest.mark.parametrize("name", list(paths()))
def test_penalties(benchmark, name):  # noqa: D103
    fn = paths()[name]
    with bm.threads(2):
        benchmark(fn)


def table(repeat: int = 30, n_threads: int = 2) -> str:
    """Median per path, the paths interleaved round-robin so that the load of a shared
    machine drifts over all of them alike."""
    ps = paths()
    times: dict[str, list[float]] = {k: [] for k in ps}
    with bm.threads(n_threads):
        for fn in ps.values():
            fn()
        for _ in range(repeat):
            for k, fn in ps.items():
                t0 = time.perf_counter()
                fn()
                times[k].append((time.perf_counter() - t0) * 1e3)
    lines = [f"| path (B=64, V=152064, {n_threads} threads) | median ms | min ms |", "|---|---|---|"]
    lines += [f"| {k} | {statistics.median(v):.2f} | {min(v):.2f} |" for k, v in times.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    for n in (1, 2):
        print(table(n_threads=n), end="\n\n")
