"""Model probe: does a causal LM give one token the same bits however it is batched?

:func:`probe_model` runs five checks on a :class:`~detsample.models.base.CausalLM`, each
bitwise on the logits of every compared position and on the raw logprob
(``log_softmax``) of a token sampled (seeded) from the reference logits:

``batch_invariance``  a prompt alone vs at a random (interior) slot of a batch of mixed lengths
                      (prefill, then one decode step with mixed cache lengths), with
                      left and right padding when the adapter offers both
``prefill_decode``    every position by incremental decode with a KV cache vs one
                      full prefill
``chunked_prefill``   the prompt in chunks of :attr:`ProbeConfig.chunks` vs at once
``run_to_run``        the full prefill and the batch forward twice
``threads``           the same at ``threads[0]`` vs ``threads[1]`` intra-op threads
                      (CPU; on CUDA the check holds vacuously and says so)

A failed check is localised (:mod:`detsample.probe.localize`) at its first differing
position: the first module and aten op where the two forwards part ways.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from detsample.invariant import batch_invariant
from detsample.invariant.guard import RefusedLayerError, UncoveredOpWarning, findings
from detsample.invariant.report import kernel_rows
from detsample.invariant.state import plans
from detsample.models.base import CausalLM, ModelError
from detsample.ops.logprobs import gather_rows, log_softmax
from detsample.probe.compare import bits_equal, diff
from detsample.probe.localize import Divergence, Side, first_divergence
from detsample.probe.report import ModelReport, ProbeCheck
from detsample.probe.threads import torch_threads

CHECK_NAMES = ("batch_invariance", "prefill_decode", "chunked_prefill", "run_to_run", "threads")


@dataclass(frozen=True)
class ProbeConfig:
    """Sizes of the model probe. ``prompt_len``: the probed prompt; ``neighbours``: the
    lengths of the other rows of the batch (mixed: shorter and longer); ``chunks``: chunk
    sizes for chunked prefill, cycled; ``threads``: the two thread counts compared;
    ``seed``: tokens, the batch slot and the sampled tokens; ``localize``: find the
    first divergence of a failed check."""

    prompt_len: int = 40
    neighbours: tuple[int, ...] = (5, 57, 23, 1, 40, 12, 33)
    chunks: tuple[int, ...] = (5, 11, 16)
    threads: tuple[int, int] = (1, 2)
    seed: int = 0
    localize: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.prompt_len, bool) or not isinstance(self.prompt_len, int) or self.prompt_len < 2:
            raise ValueError(f"prompt_len must be an int >= 2, got {self.prompt_len!r}")
        for field in ("neighbours", "chunks"):
            v = getattr(self, field)
            if not v or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in v):
                raise ValueError(f"{field} must be a non-empty tuple of ints >= 1, got {v!r}")
        if len(self.threads) != 2 or any(not isinstance(t, int) or t < 1 for t in self.threads):
            raise ValueError(f"threads must be two ints >= 1, got {self.threads!r}")

    @property
    def max_len(self) -> int:
        """The longest sequence a check feeds the model (a row plus one decode step)."""
        return max(self.prompt_len, *self.neighbours) + 1


# -- comparing per-position logits -------------------------------------------------------


@dataclass(frozen=True)
class _Cmp:
    """``subject`` vs ``reference`` logits of ``n`` positions: the positions that differ
    (logits), how many sampled-token logprobs differ, and the largest distances."""

    n: int
    differing: tuple[int, ...]
    logprobs_differing: int
    max_abs: float
    max_ulp: int

    @property
    def ok(self) -> bool:
        return not self.differing and not self.logprobs_differing

    def text(self) -> str:
        if self.ok:
            return f"{self.n}/{self.n} positions equal"
        return (
            f"logits differ at {len(self.differing)}/{self.n} positions (first: "
            f"{self.differing[0]}; max |d| {self.max_abs:.3g}, {self.max_ulp} ulp), "
            f"sampled-token logprob at {self.logprobs_differing}/{self.n}"
        )


def _compare(subject: torch.Tensor, reference: torch.Tensor, seed: int) -> _Cmp:
    """Both ``(n, V)`` float32. The sampled token of each position is drawn (seeded) from
    the reference logits, so both sides are scored on the same token."""
    if subject.shape != reference.shape:
        raise ModelError(
            f"the model returned logits of shape {list(subject.shape)} where {list(reference.shape)} was expected"
        )
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(reference.detach().cpu().to(torch.float64), -1)
    bad = torch.isnan(probs).any(-1).nonzero().flatten().tolist()
    if bad:  # NaN or +inf logits, or a row of -inf: no distribution to draw the token from
        row = reference[bad[0]].detach().cpu()
        what = "NaN" if bool(row.isnan().any()) else "+inf" if bool((row == math.inf).any()) else "-inf everywhere"
        raise ModelError(
            f"the model's logits are not a distribution at {len(bad)} of "
            f"{reference.shape[0]} positions (first: position {bad[0]}, {what}); "
            f"the probe scores a token drawn from them"
        )
    tokens = torch.multinomial(probs, 1, generator=g).squeeze(1)
    lp_s = gather_rows(log_softmax(subject.cpu()), tokens)
    lp_r = gather_rows(log_softmax(reference.cpu()), tokens)
    lp_bad = int((lp_s.view(torch.int32) != lp_r.view(torch.int32)).sum())
    differing = tuple(i for i in range(subject.shape[0]) if not bits_equal(subject[i], reference[i]))
    d = diff(subject, reference)
    return _Cmp(subject.shape[0], differing, lp_bad, d.max_abs, d.max_ulp)


# -- the model's calls ------------------------------------------------------------------


def _tokens(n: int, vocab: int, gen: torch.Generator) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def _slot(model: CausalLM, n: int, width: int) -> int:
    """Column of a row's first new token in the adapter's padded layout (left padding
    puts it at ``width - n``; adapters without a ``padding`` attribute pad right)."""
    return width - n if getattr(model, "padding", "right") == "left" else 0


def _decode_all(model: CausalLM, seq: Sequence[int], upto: int | None = None) -> tuple[Any, list[torch.Tensor]]:
    """Decode ``seq[:upto]`` one token at a time; the cache and each step's logits."""
    cache, outs = model.new_cache(), []
    for t in seq[: len(seq) if upto is None else upto]:
        outs.append(model.forward([cache], [[t]])[0])
    return cache, outs


def _split(n: int, sizes: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` chunks covering ``n`` tokens, sizes cycled."""
    out, start, i = [], 0, 0
    while start < n:
        end = min(n, start + sizes[i % len(sizes)])
        out.append((start, end))
        start, i = end, i + 1
    return out


class _Probe:
    """One model under probe: its sequences and the forwards the checks share."""

    def __init__(self, model: CausalLM, cfg: ProbeConfig) -> None:
        self.model, self.cfg = model, cfg
        if model.max_seq_len is not None and model.max_seq_len < cfg.max_len:
            raise ModelError(
                f"model {model.name!r} holds max_seq_len={model.max_seq_len} "
                f"tokens; the probe needs {cfg.max_len} (ProbeConfig sizes)"
            )
        gen = torch.Generator().manual_seed(cfg.seed)
        V = model.vocab_size
        self.seq = _tokens(cfg.prompt_len, V, gen)
        self.next_token = _tokens(1, V, gen)[0]
        others = [_tokens(n, V, gen) for n in cfg.neighbours]
        # an interior slot when there are neighbours on both sides to have
        lo, hi = (1, len(others)) if len(others) >= 2 else (0, len(others) + 1)
        self.slot = int(torch.randint(lo, hi, (1,), generator=gen))
        self.rows = others[: self.slot] + [self.seq] + others[self.slot :]
        self.next_tokens = _tokens(len(self.rows), V, gen)
        self.next_tokens[self.slot] = self.next_token
        self.module = getattr(model, "module", None)
        if not isinstance(self.module, torch.nn.Module):
            self.module = None
        dev = getattr(model, "device", None)
        self.on_cuda = isinstance(dev, torch.device) and dev.type == "cuda"

    # the forwards ---------------------------------------------------------------------
    def full(self, model: CausalLM | None = None) -> torch.Tensor:
        m = model or self.model
        return m.forward([m.new_cache()], [self.seq])[0]

    def batch(self, model: CausalLM | None = None) -> tuple[list[Any], list[torch.Tensor]]:
        m = model or self.model
        caches = [m.new_cache() for _ in self.rows]
        return caches, m.forward(caches, self.rows)

    # localisation sides ---------------------------------------------------------------
    def side_full(
        self,
        pos: int,
        model: CausalLM | None = None,
        wrap: Callable[[Callable[[], Any]], Callable[[], Any]] = lambda f: f,
    ) -> Side:
        return Side(wrap(lambda: self.full(model)), 0, pos, 1, len(self.seq))

    def side_batch(
        self,
        pos: int,
        model: CausalLM | None = None,
        wrap: Callable[[Callable[[], Any]], Callable[[], Any]] = lambda f: f,
    ) -> Side:
        m = model or self.model
        width = max(len(r) for r in self.rows)
        return Side(wrap(lambda: self.batch(m)), self.slot, _slot(m, len(self.seq), width) + pos, len(self.rows), width)

    def localize(self, a: Side, b: Side) -> tuple[Divergence | None, str]:
        """The first divergence of ``a`` vs ``b`` and a note when none was found."""
        if not self.cfg.localize:
            return None, ""
        try:
            found = first_divergence(a, b, self.module, self.model.name)
        except Exception as e:  # a model the recorder cannot follow: report, do not crash
            return None, f"; not localised ({type(e).__name__}: {e})"
        if found is None:
            return None, "; not localised (no followed tensor differs)"
        return found, ""


# -- the checks -------------------------------------------------------------------------


def _variants(model: CausalLM) -> list[tuple[str, CausalLM]]:
    if callable(getattr(model, "with_padding", None)):
        return [(p, model.with_padding(p)) for p in ("left", "right")]
    return [(getattr(model, "padding", "right"), model)]


def check_batch_invariance(p: _Probe) -> ProbeCheck:
    seed, parts, failed = p.cfg.seed, [], None
    for padding, m in _variants(p.model):
        alone_cache = m.new_cache()
        alone = m.forward([alone_cache], [p.seq])[0]
        caches, outs = p.batch(m)
        pre = _compare(alone, outs[p.slot], seed)
        step_alone = m.forward([alone_cache], [[p.next_token]])[0]
        step_batch = m.forward(caches, [[t] for t in p.next_tokens])[p.slot]
        dec = _compare(step_alone, step_batch, seed + 1)
        parts.append(
            f"{padding}-padded, slot {p.slot} of {len(p.rows)}: prefill "
            f"{pre.text()}; decode step {'equal' if dec.ok else 'differs'}"
        )
        if failed is None and not pre.ok:
            failed = (p.side_full(pre.differing[0], m), p.side_batch(pre.differing[0], m))
        elif failed is None and not dec.ok:
            failed = _decode_sides(p, m)
    div, note = p.localize(*failed) if failed else (None, "")
    return ProbeCheck("batch_invariance", failed is None, "; ".join(parts) + note, div)


def _decode_sides(p: _Probe, m: CausalLM) -> tuple[Side, Side]:
    """The batch check's decode step: alone vs in the batch, caches prepared outside."""
    alone_cache = m.new_cache()
    caches: list[Any] = []

    def alone() -> Any:
        return m.forward([alone_cache], [[p.next_token]])

    def batch() -> Any:
        return m.forward(caches, [[t] for t in p.next_tokens])

    m.forward([alone_cache], [p.seq])
    caches.extend(p.batch(m)[0])
    return Side(alone, 0, 0, 1, 1), Side(batch, p.slot, 0, len(p.rows), 1)


def check_prefill_decode(p: _Probe) -> ProbeCheck:
    full = p.full()
    _, steps = _decode_all(p.model, p.seq)
    cmp = _compare(torch.cat(steps), full, p.cfg.seed)
    detail = f"decode with a KV cache vs one prefill of {len(p.seq)} tokens: {cmp.text()}"
    if cmp.ok:
        return ProbeCheck("prefill_decode", True, detail)
    pos = cmp.differing[0]
    cache, _ = _decode_all(p.model, p.seq, pos)
    a = Side(lambda: p.model.forward([cache], [[p.seq[pos]]]), 0, 0, 1, 1)
    div, note = p.localize(a, p.side_full(pos))
    return ProbeCheck("prefill_decode", False, detail + note, div)


def check_chunked_prefill(p: _Probe) -> ProbeCheck:
    full = p.full()
    spans = _split(len(p.seq), p.cfg.chunks)
    cache, outs = p.model.new_cache(), []
    for s, e in spans:
        outs.append(p.model.forward([cache], [p.seq[s:e]])[0])
    cmp = _compare(torch.cat(outs), full, p.cfg.seed)
    sizes = ",".join(str(e - s) for s, e in spans)
    detail = f"chunks of {sizes} tokens vs one prefill: {cmp.text()}"
    if cmp.ok:
        return ProbeCheck("chunked_prefill", True, detail)
    pos = cmp.differing[0]
    s, e = next((s, e) for s, e in spans if s <= pos < e)
    cache = p.model.new_cache()
    for s0, e0 in spans:
        if s0 == s:
            break
        p.model.forward([cache], [p.seq[s0:e0]])
    a = Side(lambda: p.model.forward([cache], [p.seq[s:e]]), 0, pos - s, 1, e - s)
    div, note = p.localize(a, p.side_full(pos))
    return ProbeCheck("chunked_prefill", False, detail + note, div)


def _full_and_batch(p: _Probe) -> tuple[torch.Tensor, torch.Tensor]:
    return p.full(), p.batch()[1][p.slot]


def _twice(
    p: _Probe,
    name: str,
    label: str,
    first: Callable[[], Any],
    second: Callable[[], Any],
    wrap: tuple[Callable, Callable],
) -> ProbeCheck:
    (f1, b1), (f2, b2) = first(), second()
    cf, cb = _compare(f2, f1, p.cfg.seed), _compare(b2, b1, p.cfg.seed)
    detail = f"{label}: prefill {cf.text()}; batch row {cb.text()}"
    if cf.ok and cb.ok:
        return ProbeCheck(name, True, detail)
    if not cf.ok:
        pos = cf.differing[0]
        sides = p.side_full(pos, wrap=wrap[0]), p.side_full(pos, wrap=wrap[1])
    else:
        pos = cb.differing[0]
        sides = p.side_batch(pos, wrap=wrap[0]), p.side_batch(pos, wrap=wrap[1])
    div, note = p.localize(*sides)
    return ProbeCheck(name, False, detail + note, div)


def check_run_to_run(p: _Probe) -> ProbeCheck:
    same = (lambda f: f, lambda f: f)
    return _twice(p, "run_to_run", "two runs", lambda: _full_and_batch(p), lambda: _full_and_batch(p), same)


def _threaded(n: int) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    def wrap(f: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with torch_threads(n):
                return f()

        return run

    return wrap


def check_threads(p: _Probe) -> ProbeCheck:
    if p.on_cuda:
        return ProbeCheck("threads", True, "not applicable: the model runs on CUDA")
    t1, t2 = p.cfg.threads
    w1, w2 = _threaded(t1), _threaded(t2)
    return _twice(
        p, "threads", f"{t1} vs {t2} threads", w1(lambda: _full_and_batch(p)), w2(lambda: _full_and_batch(p)), (w1, w2)
    )


CHECKS: dict[str, Callable[[_Probe], ProbeCheck]] = {
    "batch_invariance": check_batch_invariance,
    "prefill_decode": check_prefill_decode,
    "chunked_prefill": check_chunked_prefill,
    "run_to_run": check_run_to_run,
    "threads": check_threads,
}


def probe_model(
    model: CausalLM,
    config: ProbeConfig | None = None,
    *,
    platform: str = "",
    target: str | None = None,
    checks: Sequence[str] = CHECK_NAMES,
) -> ModelReport:
    """Run ``checks`` (names of :data:`CHECK_NAMES`, in that order) on ``model``.

    ``platform`` and ``target`` (default ``model.name``) label the report. Raises
    :class:`~detsample.models.base.ModelError` when the model cannot hold the probe's
    sequences, ValueError for an unknown check name.
    """
    bad = [c for c in checks if c not in CHECKS]
    if bad:
        raise ValueError(f"unknown check {bad[0]!r}; known: {', '.join(CHECK_NAMES)}")
    p = _Probe(model, config or ProbeConfig())
    mode_on = bool(getattr(model, "batch_invariant", False))
    scope = (
        batch_invariant(portable=bool(getattr(model, "portable", False)), strict=False) if mode_on else nullcontext()
    )
    with plans().recording() as used, scope, warnings.catch_warnings():
        warnings.simplefilter("ignore", UncoveredOpWarning)  # reported as the coverage check
        try:
            results = tuple(CHECKS[name](p) for name in CHECK_NAMES if name in checks)
        except RefusedLayerError as e:
            results = (ProbeCheck("coverage", False, str(e)),)
            return ModelReport(target or model.name, platform, results, ())
    if mode_on:
        results += _coverage(model)
    kernels = tuple(kernel_rows(used)) if mode_on else ()
    return ModelReport(target or model.name, platform, results, kernels)


def _coverage(model: CausalLM) -> tuple[ProbeCheck, ...]:
    """The ``coverage`` check of a model under the mode: the ops its first forward ran
    that the mode does not cover (:mod:`detsample.invariant.guard`); none for a model the
    guard could not watch (not an ``nn.Module``)."""
    module = getattr(model, "module", None)
    found = findings(module) if isinstance(module, torch.nn.Module) else None
    if found is None:
        return ()
    if not found:
        return (ProbeCheck("coverage", True, "every op of the first forward is overridden by the mode or exact"),)
    return (
        ProbeCheck(
            "coverage",
            False,
            "ops the mode does not cover (the logits may depend on the batch): " + "; ".join(f.text() for f in found),
        ),
    )
