"""Shared test helpers: request strategies, running a row alone, thread-count context."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from detsample import Request, Sampler, SamplingBatch, SamplingParams, arith
from detsample import rules as _rules
from detsample.probe.threads import torch_threads


def num_threads(n: int):
    """Temporarily run torch with ``n`` intra-op threads (restored in finally)."""
    return torch_threads(n)


def params_strategy(vocab_size: int, with_bias: bool = True):
    """Random SamplingParams: greedy, temperature only, top-k, top-p, min-p, bias, modes."""
    bias = st.none()
    if with_bias:
        bias = st.one_of(
            st.none(),
            st.dictionaries(
                st.integers(0, vocab_size - 1), st.sampled_from([-100.0, -1.5, 0.5, 3.0, 1e30]), max_size=3
            ),
        )
    return st.builds(
        SamplingParams,
        temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.7]),
        top_k=st.sampled_from([-1, -1, 1, 2, 5, 20, vocab_size + 5]),
        top_p=st.sampled_from([1.0, 1.0, 0.3, 0.8, 0.95]),
        min_p=st.sampled_from([0.0, 0.0, 0.05, 0.5]),
        logit_bias=bias,
        seed=st.integers(0, 2**63 - 1),
        logprobs=st.sampled_from([0, 0, 1, 3]),
        logprobs_mode=st.sampled_from(["raw", "scaled", "processed", "processed_fixed"]),
    )


def logits_rows(rng: np.random.Generator, B: int, V: int, family: str) -> np.ndarray:
    """Synthetic logits families: random, ties, onehot, neginf, nan, huge, mixed, peaked
    (a language-model-like head of a dozen lifted tokens), bf16 (random values rounded to
    bfloat16, so many ties)."""
    x = rng.standard_normal((B, V)).astype(np.float32) * 3
    if family == "peaked":
        x = rng.standard_normal((B, V)).astype(np.float32) * 2
        n = min(12, V)
        for i in range(B):
            x[i, rng.choice(V, n, replace=False)] += (14.0 - 2.0 * np.log2(np.arange(n) + 1)).astype(np.float32)
    elif family == "bf16":
        x = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    elif family == "ties":
        x = np.round(x).astype(np.float32)
    elif family == "onehot":
        x = np.full((B, V), -5.0, np.float32)
        x[np.arange(B), rng.integers(0, V, B)] = 5.0
    elif family == "neginf":
        x[rng.random((B, V)) < 0.5] = -np.inf
        x[:, 0] = 1.0
    elif family == "nan":
        x[rng.random((B, V)) < 0.05] = np.nan
        x[0, :] = np.nan
    elif family == "huge":
        x = x * np.float32(1e37)
    elif family == "mixed":
        x[0] = -np.inf
        x[1 % B, : V // 2] = np.nan
        x[2 % B] = np.round(x[2 % B])
        x[3 % B] *= np.float32(1e36)
    return x


def sample_alone(sampler: Sampler, logits: torch.Tensor, req: Request, position: int, vocab_size: int, **kw):
    batch = SamplingBatch.from_requests([req], vocab_size, **kw)
    return sampler.sample(logits.unsqueeze(0).clone(), batch, torch.tensor([position]))


def row_bits_equal(out, i, alone) -> bool:
    """Token, logprob and top-logprobs of row i of ``out`` equal ``alone`` bitwise."""
    ok = torch.equal(out.token_ids[i : i + 1], alone.token_ids) and torch.equal(
        out.logprobs[i : i + 1].view(torch.int32), alone.logprobs.view(torch.int32)
    )
    n = alone.top_logprobs[0].shape[1] if alone.top_logprobs is not None else 0
    if n:
        ok = (
            ok
            and torch.equal(out.top_logprobs[0][i, :n].view(torch.int32), alone.top_logprobs[0][0].view(torch.int32))
            and torch.equal(out.top_logprobs[1][i, :n], alone.top_logprobs[1][0])
        )
    return ok


def requests_from(params_list, prefix: str = "r"):
    return [Request(f"{prefix}{i}", p, prompt_ids=[1, 2, 3]) for i, p in enumerate(params_list)]


def run_bounded(argv: list[str], unblock: list = (), seconds: float = 60.0) -> int:
    """``main(argv)`` in a thread: a command still running after ``seconds`` is a hang
    (the FIFOs of ``unblock`` are then opened for writing, so the thread ends)."""
    import os
    import threading

    import pytest

    from detsample.cli import main

    box: dict = {}

    def target():
        try:
            box["rc"] = main(argv)
        except BaseException as exc:  # noqa: BLE001 - a traceback the user would see
            box["exc"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for path in unblock:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        t.join(10)
        pytest.fail(f"detsample {' '.join(argv)}: still running after {seconds} s (a hang)")
    if "exc" in box:
        raise AssertionError(f"an exception escaped main: {box['exc']!r}") from box["exc"]
    return box["rc"]


def topk_candidates(z: torch.Tensor, top_k: torch.Tensor, k_max: int):
    """The bounded candidates of rows with a small top-k, as the sampler takes them
    first: a ``topk`` of ``K = min(k_max + 1, V)`` values. Returns ``(vals, ids, fits)``,
    ``fits`` (rows,) bool: every top-k survivor is a candidate (the last candidate is
    below the k-th value, or K = V)."""
    V = z.shape[-1]
    vals, ids = torch.topk(z, min(k_max + 1, V), dim=-1, largest=True, sorted=True)
    k = top_k.to(torch.int64).clamp(1, k_max).unsqueeze(1)
    fits = vals[:, -1] < vals.gather(1, k - 1).squeeze(1)
    return vals, ids, fits | (vals.shape[-1] == V)


def compact_cdf(
    vals: torch.Tensor, ids: torch.Tensor, n_kept: torch.Tensor, frac: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reference for ``draw.id_order_cdf``: the kept tokens' CDF in token-id order from
    the kept prefix length (the kept set written a second, independent way).

    vals: (rows, K) float32 scaled logits sorted descending; ids: (rows, K) int64 their
    token ids; n_kept: (rows,) int64 in [1, K] (the kept prefix). Returns ``(sorted_ids,
    csum)``, both (rows, K): the kept ids ascending (then a padding id larger than any
    token) and the running int64 sum of their masses ``q``; ``csum[:, -1]`` is the exact
    kept mass ``Q`` of the row.
    """
    K = vals.shape[-1]
    kept = torch.arange(K, device=vals.device).unsqueeze(0) < n_kept.unsqueeze(1)
    key = torch.where(kept, ids, torch.full_like(ids, _rules.PAD_ID))
    sorted_ids, order = torch.sort(key, dim=-1)
    q = _rules.mass(arith.exp(vals.gather(1, order)), frac) * (sorted_ids != _rules.PAD_ID)
    return sorted_ids, q.cumsum(-1)
