"""Why the engine's logprobs differ from the trainer's: the semantics diagnosis.

The most common cause of a mismatch is semantics, not kernels: the engine reported
processed logprobs (after temperature and top-k / top-p / min-p renormalisation) and the
trainer computed raw ones. Two diagnoses, both in the report under ``"diagnosis"`` and
printed as one line beginning ``semantics:``:

* With a rescoring model (:func:`search`): over the logits of the rescoring's own
  forward (a bounded sample of tokens), a 1-D search in temperature for every filter of a
  small grid (:data:`FILTER_GRID`) finds the semantics whose logprobs are nearest the
  engine's; the winner is then rescored exactly (the Sampler's processed path, as
  ``--logprobs-mode processed ...`` would) and named when it is within
  :data:`NOISE` -- else no semantics on the grid explains the numbers, and the model or
  its kernels differ (``detsample probe``).
* Without a model (:func:`signature`): the signed mean d = trainer - engine per engine
  probability bucket. A sharper engine distribution (T < 1, or a filter's
  renormalisation: processed logprobs) gives d > 0 on improbable tokens and d < 0 on
  probable ones; a flatter one (T > 1) the reverse; a filter at T = 1 gives d < 0
  everywhere (the kept mass, log M < 0).

The search is exact about the kept set's shape: for T > 0 the order of a row's logits
does not depend on T, so every filter keeps a prefix of the row sorted once, and the
normaliser of a prefix is one ``logcumsumexp`` per temperature (float64), shared by every
filter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from detsample.audit.semantics import RAW, Semantics
from detsample.params import filter_options
from detsample.rules import ELEMENT_FILTERS

#: the largest max |d| a semantics may leave and still "explain" the engine's numbers:
#: float32 kernel noise on one model is ~1e-6..1e-5 (bf16 models ~1e-2: their audits are
#: beyond this bound, and the line then says no semantics explains them)
NOISE = 1e-3
#: tokens the search reads at most (the first sequences' trained tokens)
MAX_TOKENS = 256
#: temperatures of the coarse search (then refined to 0.01 around the best)
T_GRID = tuple(round(0.05 * k, 2) for k in range(1, 41))
#: the filters of the table by kind: top-k (a rank), top-p (a mass) and the element-wise
#: ones (``rules.ELEMENT_FILTERS`` with a ``least``: keep z >= z_max + log(least(value)),
#: a prefix of the sorted row); each filter's values are its ``grid``
_OPTIONS = {o.name: o for o in filter_options()}
_ELEMENTS = tuple(f for f in ELEMENT_FILTERS if f.least is not None and f.name in _OPTIONS)
#: the single filters tried at every temperature (and none)
SINGLE_FILTERS = (
    (("top_k", -1),),
    *((("top_p", p),) for p in _OPTIONS["top_p"].grid),
    *((("top_k", k),) for k in _OPTIONS["top_k"].grid),
    *(((f.name, v),) for f in _ELEMENTS for v in _OPTIONS[f.name].grid),
)

#: the grid as arrays: top-k values (-1: no filter), top-p values, element-filter settings
_TOP_K = tuple(v for ((n, v),) in SINGLE_FILTERS if n == "top_k")
_TOP_P = tuple(v for ((n, v),) in SINGLE_FILTERS if n == "top_p")
_ELEMENT_GRID = tuple((n, v) for ((n, v),) in SINGLE_FILTERS if n not in ("top_k", "top_p"))
#: top-k values combined with every top-p (top-k 1 is greedy whatever top-p does)
_COMBO_K = tuple(k for k in _TOP_K if k > 1)
_COMBO_COLS = [_TOP_K.index(k) for k in _COMBO_K]
_P = torch.tensor(_TOP_P, dtype=torch.float64)
_LEAST = {f.name: f.least for f in _ELEMENTS}
_LOG_LEAST = torch.log(torch.tensor([_LEAST[n](v) for n, v in _ELEMENT_GRID], dtype=torch.float64))
#: the combinations engines use: top-k with top-p (top-p over the top-k survivors, as
#: vLLM and detsample apply them; e.g. Hugging Face's 50 / 0.95, Qwen's 20 / 0.8) and an
#: element-wise filter (min-p) with top-p in vLLM's order (top-p over the min-p
#: survivors; detsample applies min-p after top-p, where the pair keeps what the stricter
#: one keeps: :data:`ORDER_NOTE`)
COMBINED_FILTERS = tuple((("top_k", k), ("top_p", p)) for k in _COMBO_K for p in _TOP_P) + tuple(
    (e, ("top_p", p)) for e in _ELEMENT_GRID for p in _TOP_P
)
#: every filter setting tried at every temperature, in the order of :func:`_scores`'s columns
FILTER_GRID = (
    tuple((("top_k", v),) for v in _TOP_K)
    + tuple((("top_p", v),) for v in _TOP_P)
    + tuple((e,) for e in _ELEMENT_GRID)
    + COMBINED_FILTERS
)


@dataclass(frozen=True)
class _Rows:
    """The search's inputs, sorted once: x_sorted (N, V) float64 descending; x_tok (N,)
    the token's logit; rank (N,) entries strictly above it; engine (N,) float64; kept_k
    (N, len(_TOP_K)) the prefix each top-k keeps (ties at the boundary kept; T-free)."""

    x_sorted: torch.Tensor
    x_tok: torch.Tensor
    rank: torch.Tensor
    engine: torch.Tensor
    kept_k: torch.Tensor

    @classmethod
    def of(cls, logits: torch.Tensor, tokens: torch.Tensor, engine: torch.Tensor) -> _Rows:
        x = logits.to(torch.float64)
        xt = x.gather(1, tokens.view(-1, 1)).view(-1)
        s = x.sort(dim=-1, descending=True).values
        V = s.shape[1]
        neg = (-s).contiguous()  # ascending: counts of s >= v by searchsorted
        kth = torch.stack([s[:, min(k, V) - 1] if k != -1 else s[:, -1] for k in _TOP_K], 1)
        kept_k = torch.searchsorted(neg, (-kth).contiguous(), right=True)
        return cls(s, xt, (x > xt.view(-1, 1)).sum(dim=1), engine.to(torch.float64), kept_k)


def _scores(r: _Rows, t: float) -> dict[tuple, float]:
    """max |engine - lp| of every filter of :data:`FILTER_GRID` at temperature ``t``:
    each filter keeps a prefix of the sorted row (top-p: while the mass strictly before
    is < p, of the whole row or of a top-k / element-filter prefix; an element filter:
    exp(z_i - z_max) >= least(value), e.g. min-p p_i >= min_p p_max), its normaliser one
    ``logcumsumexp`` entry. Two ``searchsorted`` calls in all (the element filters'
    prefixes, then every top-p threshold at once)."""
    z = r.x_sorted / t
    lcse = torch.logcumsumexp(z, dim=1)
    total = lcse[:, -1:]
    before = torch.cat(
        [torch.zeros_like(total), torch.exp(lcse[:, :-1] - total)], dim=1
    ).contiguous()  # mass strictly before entry j, of the row
    n = z.shape[0]
    kept_m = torch.searchsorted((-z).contiguous(), (-(z[:, :1] + _LOG_LEAST)).contiguous(), right=True)
    prefix = torch.cat([r.kept_k[:, _COMBO_COLS], kept_m], dim=1)  # top-p runs within these
    mass = torch.exp(lcse.gather(1, prefix - 1) - total)
    thr = torch.cat([_P.expand(n, -1), (mass.unsqueeze(2) * _P).reshape(n, -1)], dim=1)
    kept = torch.searchsorted(before, thr.contiguous(), right=False).clamp(min=1)
    kept_p, within = kept[:, : len(_TOP_P)], kept[:, len(_TOP_P) :]
    within = torch.minimum(within, prefix.repeat_interleave(len(_TOP_P), dim=1))
    m = torch.cat([r.kept_k, kept_p, kept_m, within], dim=1)  # (N, F)
    lp = r.x_tok.view(-1, 1) / t - lcse.gather(1, m - 1)
    lp = torch.where(r.rank.view(-1, 1) < m, lp, torch.full_like(lp, -math.inf))
    worst = (r.engine.view(-1, 1) - lp).abs().amax(dim=0)
    return dict(zip(FILTER_GRID, worst.tolist()))


def _semantics(t: float, filt: tuple) -> Semantics:
    fields: dict = {"temperature": t}
    for name, value in filt:
        if value != _OPTIONS[name].neutral:
            fields[name] = value
    if t == 1.0 and len(fields) == 1:
        return RAW
    return Semantics("processed", **fields)


def search(logits: torch.Tensor, tokens: torch.Tensor, engine: torch.Tensor) -> tuple[Semantics, float]:
    """The semantics on the grid whose logprobs are nearest ``engine`` (max |d|, float64
    search figure): logits (N, V) float32 that scored ``tokens`` (N,) int64; engine (N,)
    the engine's logprobs of them. Temperatures on :data:`T_GRID`, then to 0.01 around
    the best; the exact figure is the caller's (:func:`diagnose_model`)."""
    r = _Rows.of(logits, tokens, engine)
    best = (math.inf, 1.0, FILTER_GRID[0])
    for t in T_GRID:
        for filt, score in _scores(r, t).items():
            best = min(best, (score, t, filt), key=lambda b: b[0])
    _, t0, _ = best
    for k in range(-4, 5):
        t = round(t0 + 0.01 * k, 2)
        if t > 0 and k:
            for filt, score in _scores(r, t).items():
                best = min(best, (score, t, filt), key=lambda b: b[0])
    score, t, filt = best
    return _semantics(t, filt), score


def signature(report: dict) -> dict:
    """The model-free diagnosis: signed mean d by engine-probability bucket, and the
    pattern it shows (``sharper``, ``flatter``, ``renormalised``, ``noise`` or
    ``none``) with what it suggests."""
    rows = [b for b in report.get("by_probability", []) if b.get("tokens")]
    lo = _mean_diff([b for b in rows if _bucket_low(b["bucket"]) < 0.1])
    hi = _mean_diff([b for b in rows if _bucket_low(b["bucket"]) >= 0.1])
    biggest = report.get("max_abs_diff") or 0.0
    if biggest <= NOISE:
        pattern, text = "noise", f"max |d| {biggest:.3g} is within kernel noise"
    elif lo > NOISE and hi < -NOISE:
        pattern, text = (
            "sharper",
            (
                "the engine's distribution is sharper than the trainer's (d > 0 on improbable "
                "tokens, d < 0 on probable ones): it likely reported processed logprobs at a "
                "temperature below 1 or after top-k / top-p / min-p; rescore with --rescore MODEL "
                "to find which, or give --logprobs-mode processed and its sampling options"
            ),
        )
    elif lo < -NOISE and hi > NOISE:
        pattern, text = (
            "flatter",
            (
                "the engine's distribution is flatter than the trainer's (d < 0 on improbable "
                "tokens, d > 0 on probable ones): it likely reported logprobs at a temperature "
                "above 1"
            ),
        )
    elif lo < -NOISE and hi < -NOISE and all(b["mean_diff"] < -NOISE for b in rows):
        pattern, text = (
            "renormalised",
            (
                "d < 0 in every probability bucket: the engine's logprobs are renormalised over "
                "a kept set (processed logprobs after top-k / top-p / min-p at temperature 1)"
            ),
        )
    elif lo < -NOISE and hi < -NOISE:
        pattern, text = (
            "renormalised",
            (
                "d < 0 on average below and above p = 0.1, though not in every bucket: the "
                "engine's logprobs are likely renormalised over a kept set, possibly at another "
                "temperature; rescore with --rescore MODEL to find which"
            ),
        )
    else:
        pattern, text = (
            "none",
            (
                "no semantics pattern in the signed d: the model or its kernels likely differ "
                "(run `detsample probe model MODEL`)"
            ),
        )
    return {
        "pattern": pattern,
        "mean_diff_below_0.1": lo,
        "mean_diff_from_0.1": hi,
        "by_probability": {b["bucket"]: b["mean_diff"] for b in rows},
        "suggests": text,
    }


def _mean_diff(buckets: list[dict]) -> float:
    """The token-weighted mean d of probability buckets (0 for none)."""
    n = sum(b["tokens"] for b in buckets)
    return sum(b["mean_diff"] * b["tokens"] for b in buckets) / n if n else 0.0


def _bucket_low(label: str) -> float:
    return float(label.strip("[(").split(",")[0])


def model_line(
    current: Semantics,
    current_max: float,
    best: Semantics,
    best_max: float,
    model: str,
    search_max: float | None = None,
) -> tuple[bool, str]:
    """(explained, the ``semantics:`` line) of a model diagnosis. ``search_max``: the
    search's own figure, which names a min-p + top-p pair in vLLM's order when detsample's
    rescoring of it (min-p after top-p) is beyond noise (:data:`ORDER_NOTE`)."""
    element = [f.name for f in _ELEMENTS if getattr(best, f.name) != _OPTIONS[f.name].neutral]
    if best_max > NOISE and search_max is not None and search_max <= NOISE and element and best.top_p < 1:
        return True, (
            f"semantics: the engine's logprobs match {best.describe()} with "
            f"{element[0].replace('_', '-')} "
            f"applied before top-p (vLLM's order; max |d| {search_max:.3g}; as "
            f"{current.describe()} {current_max:.3g}): {ORDER_NOTE}, so "
            f"rescoring with {best.flags()} leaves {best_max:.3g}"
        )
    if best_max <= NOISE and best != current:
        return True, (
            f"semantics: the engine's logprobs match {best.describe()} (max |d| "
            f"{best_max:.3g}; as {current.describe()} {current_max:.3g}): rescore "
            f"with {best.flags()}"
        )
    if best_max <= NOISE:
        return True, (
            f"semantics: the engine's logprobs are {current.describe()} on the "
            f"sampled tokens (max |d| {best_max:.3g}); the rest of the mismatch "
            f"({current_max:.3g}) is in other sequences"
        )
    return False, (
        f"semantics: no semantics on the grid explains the engine's logprobs "
        f"(nearest: {best.describe()}, max |d| {best_max:.3g}; as "
        f"{current.describe()} {current_max:.3g}): the model or its kernels "
        f"differ; run `detsample probe model {model}`"
    )


#: why a min-p + top-p pair of vLLM's cannot be rescored bit for bit
ORDER_NOTE = (
    "detsample's processed logprobs apply min-p after top-p, where the pair keeps what the stricter filter keeps"
)


def signature_line(sig: dict) -> str:
    return (
        f"semantics: {sig['suggests']} (mean d {sig['mean_diff_below_0.1']:+.3g} for "
        f"p < 0.1, {sig['mean_diff_from_0.1']:+.3g} for p >= 0.1)"
    )


@dataclass(frozen=True)
class Sequence:
    """One sequence the model diagnosis reads: ids, the engine's logprobs, the mask, and
    the semantics its row states (None: the rescoring's own)."""

    prompt_ids: list
    response_ids: list
    engine: list
    mask: list
    semantics: Semantics | None = None


def diagnose(report: dict, rescorer, sample: list[Sequence]) -> dict | None:
    """The report's ``"diagnosis"``: None when nothing was audited; ``needed`` False
    when max |d| is within :data:`NOISE`; else the :func:`signature` and, with a model
    rescorer (:class:`~detsample.audit.running.rescore.ModelRescorer` or ``TPRescorer``: its
    ``logits``, ``score``, ``semantics``) and a ``sample`` of the first sequences, the
    model search (``semantics``, ``max_abs_diff`` of the named semantics, ``explained``),
    and the ``line``. Rows stating different semantics (per-row columns) are searched
    per group of equal stated semantics: ``groups``, one entry each, the line one line
    per group."""
    if not report.get("tokens"):
        return None
    biggest = float(report["max_abs_diff"])
    if biggest <= NOISE:
        return {"needed": False, "line": None, "noise_bound": NOISE}
    sig = signature(report)
    out = {
        "needed": True,
        "noise_bound": NOISE,
        "signature": sig,
        "semantics": None,
        "explained": None,
        "line": signature_line(sig),
    }
    if rescorer is None:
        return out
    groups: dict[Semantics, list[Sequence]] = {}
    for seq in sample:
        groups.setdefault(seq.semantics or rescorer.semantics, []).append(seq)
    found = [_group(rescorer, stated, seqs, biggest if len(groups) == 1 else None) for stated, seqs in groups.items()]
    found = [g for g in found if g is not None]
    if len(found) == 1:
        out.update({k: v for k, v in found[0].items() if k not in ("stated", "sequences")})
    elif found:
        for g in found:
            g["line"] = g["line"].replace(
                "semantics: ",
                f"semantics: rows stating {Semantics(**g['stated']).describe()} ({g['sequences']} sequences): ",
                1,
            )
        out.update(
            groups=found,
            explained=all(g["explained"] for g in found),
            line="\n".join(g["line"] for g in found),
            tokens_searched=sum(g["tokens_searched"] for g in found),
        )
    return out


def _group(rescorer, stated: Semantics, seqs: list[Sequence], biggest: float | None) -> dict | None:
    """The search over one group of sequences stating ``stated``: its best semantics, the
    exact figure, the line (None: no trained token). ``biggest``: the audit's max |d|
    when this is the only group, else the group's own, measured here."""
    tokens = _tokens(rescorer, seqs)
    if not tokens:
        return None
    logits, ids, engine = tokens
    current_max = _exact_max(rescorer, seqs, stated) if biggest is None else biggest
    if current_max <= NOISE:  # this group is right as stated: nothing to search
        best, best_max, search_max, explained = stated, current_max, current_max, True
        line = (
            f"semantics: the engine's logprobs are {stated.describe()} (max |d| {current_max:.3g}, within kernel noise)"
        )
    else:
        best, search_max = search(logits, ids, engine)
        best_max = _exact_max(rescorer, seqs, best)
        explained, line = model_line(stated, current_max, best, best_max, rescorer.model, search_max)
    return {
        "stated": stated.to_dict(),
        "sequences": len(seqs),
        "semantics": best.to_dict(),
        "semantics_flags": best.flags(),
        "max_abs_diff": best_max,
        "search_max_abs_diff": search_max,
        "explained": explained,
        "line": line,
        "tokens_searched": int(ids.numel()),
    }


def _tokens(rescorer, sample: list[Sequence]):
    """(logits (N, V), ids (N,), engine (N,)) of the trained tokens of ``sample``, at most
    :data:`MAX_TOKENS`, from the rescorer's forwards (kept ones reused); None if empty."""
    rows, ids, eng = [], [], []
    for seq in sample:
        lg = rescorer.logits(seq.prompt_ids, seq.response_ids)
        keep = [i for i, m in enumerate(seq.mask) if m][: MAX_TOKENS - len(ids)]
        rows += [lg[i] for i in keep]
        ids += [seq.response_ids[i] for i in keep]
        eng += [seq.engine[i] for i in keep]
        if len(ids) >= MAX_TOKENS:
            break
    if not ids:
        return None
    return (torch.stack(rows).float(), torch.tensor(ids, dtype=torch.int64), torch.tensor(eng, dtype=torch.float64))


def _exact_max(rescorer, sample: list[Sequence], semantics: Semantics) -> float:
    """max |engine - rescored| over the trained tokens of ``sample`` in ``semantics``,
    by the rescoring path itself (the figure the named options would give)."""
    worst, seen = 0.0, 0
    for seq in sample:
        lp = rescorer.score(seq.prompt_ids, seq.response_ids, semantics)
        for i, m in enumerate(seq.mask):
            if m and seen < MAX_TOKENS:
                worst = max(worst, abs(float(lp[i]) - float(seq.engine[i])))
                seen += 1
    return worst
