"""Bitwise comparison of a scenario's obtained outputs with its golden outputs.

Comparison is on bits, never on tolerances: a logprob "moved" when its uint32 pattern
changed, so ``-0.0`` vs ``0.0`` and a NaN payload change count. The ULP histogram and the
worst positions only help a human judge *how far* things moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from detsample.golden import bits
from detsample.golden.format import ScenarioOutput, float_text


def ulp_distance(golden_bits: np.ndarray, obtained_bits: np.ndarray) -> np.ndarray:
    """[N] int64 ULP distance between float32 bit patterns; -1 where either is NaN."""
    d = bits.distance(golden_bits, obtained_bits, bits.FLOAT32).astype(np.int64)
    nan = bits.is_nan(golden_bits, bits.FLOAT32) | bits.is_nan(obtained_bits, bits.FLOAT32)
    return np.where(nan, -1, d)


@dataclass(frozen=True)
class Divergence:
    """One entry whose token or logprob bits differ."""

    index: int
    rid: str
    position: int
    golden_token: int
    obtained_token: int
    golden_bits: int
    obtained_bits: int
    ulp: int  # -1 when a NaN is involved

    def describe(self) -> str:
        g, o = self.golden_bits, self.obtained_bits
        tok = (
            f"token {self.golden_token}"
            if self.golden_token == self.obtained_token
            else f"token {self.golden_token} -> {self.obtained_token}"
        )
        lp = (
            f"logprob 0x{g:08x} ({float_text(g)})"
            if g == o
            else f"logprob 0x{g:08x} ({float_text(g)}) -> 0x{o:08x} ({float_text(o)}), "
            f"{'NaN' if self.ulp < 0 else f'{self.ulp} ulp'}"
        )
        return f"request {self.rid} position {self.position} (entry {self.index}): {tok}; {lp}"


@dataclass(frozen=True)
class TopDiff:
    """The top logprobs of the common entries compared: ``mismatches`` counts the
    (entry, rank) pairs whose token id or bits differ, plus ranks only one side has."""

    mismatches: int
    golden_total: int
    obtained_total: int
    first: str | None = None
    ulp_histogram: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def lines(self) -> list[str]:
        if self.ok:
            return []
        out = [f"  first top-logprob divergence: {self.first}"]
        if self.ulp_histogram:
            out.append("  top logprob ULP histogram: " + ", ".join(f"{k}: {v}" for k, v in self.ulp_histogram.items()))
        if self.golden_total == 0:
            out.append(
                f"  note: the golden records no top logprobs but {self.obtained_total} "
                "were obtained (a golden written before top logprobs were recorded, or "
                "whose rows did not ask for them): regenerate it"
            )
        return out


def _describe_top(out: ScenarioOutput, j: int) -> str:
    b = int(out.top_logprobs.view("<u4")[j])
    return f"id {int(out.top_ids[j])} 0x{b:08x} ({float_text(b)})"


def compare_top(golden: ScenarioOutput, obtained: ScenarioOutput, n: int) -> TopDiff:
    """Compare the top logprobs of the first ``n`` entries, rank by rank, on bits."""
    go, oo = golden.top_offsets, obtained.top_offsets
    gbits, obits = golden.top_logprobs.view("<u4"), obtained.top_logprobs.view("<u4")
    mismatches, first, dists = 0, None, []
    for i in range(n):
        gc, oc = int(golden.top_counts[i]), int(obtained.top_counts[i])
        k = min(gc, oc)
        gs, os_ = slice(go[i], go[i] + k), slice(oo[i], oo[i] + k)
        bad_bits = gbits[gs] != obits[os_]
        bad = (golden.top_ids[gs] != obtained.top_ids[os_]) | bad_bits
        mismatches += int(bad.sum()) + abs(gc - oc)
        d = ulp_distance(gbits[gs][bad_bits], obits[os_][bad_bits])
        dists.extend(d.tolist())
        where = f"request {obtained.rids[i]} position {int(obtained.positions[i])}"
        if first is None and bad.any():
            r = int(np.argmax(bad))
            first = f"{where} rank {r}: {_describe_top(golden, go[i] + r)} -> {_describe_top(obtained, oo[i] + r)}" + (
                f", {'NaN' if d[0] < 0 else f'{int(d[0])} ulp'}" if bad_bits[r] else ""
            )
        elif first is None and gc != oc:
            first = f"{where}: {gc} top logprobs in the golden, {oc} obtained"
    arr = np.array(dists, dtype=np.int64)
    return TopDiff(
        mismatches,
        int(golden.top_counts[:n].sum()),
        int(obtained.top_counts[:n].sum()),
        first,
        bits.histogram(np.maximum(arr, 0).astype(np.uint64), arr < 0),
    )


@dataclass(frozen=True)
class GoldenDiff:
    """Result of comparing one scenario; ``ok`` iff every bit is equal."""

    scenario: str
    golden_n: int
    obtained_n: int
    token_mismatches: int
    logprob_mismatches: int
    label_mismatches: int
    first: Divergence | None
    ulp_histogram: dict[str, int] = field(default_factory=dict)
    worst: tuple[Divergence, ...] = ()
    unmatched: str | None = None  # the first entry beyond the shorter side, described
    top: TopDiff | None = None

    @property
    def ok(self) -> bool:
        return (
            self.golden_n == self.obtained_n
            and self.first is None
            and self.label_mismatches == 0
            and (self.top is None or self.top.ok)
        )

    def summary(self) -> str:
        """One line: what moved."""
        if self.ok:
            return f"{self.scenario}: unchanged ({self.golden_n} entries, all bits equal)"
        parts = []
        if self.golden_n != self.obtained_n:
            parts.append(f"{self.golden_n} -> {self.obtained_n} entries")
        if self.label_mismatches:
            parts.append(f"{self.label_mismatches} request/position labels differ")
        parts.append(f"{self.token_mismatches} tokens differ")
        parts.append(f"{self.logprob_mismatches} logprobs differ in bits")
        if self.top is not None and not self.top.ok:
            parts.append(f"{self.top.mismatches} top logprobs differ")
        return f"{self.scenario}: " + ", ".join(parts)

    def report(self) -> str:
        """Multi-line human report: count, first divergence, ULP histogram, worst entries."""
        lines = [self.summary()]
        if self.ok:
            return lines[0]
        if self.first is not None:
            lines.append(f"  first divergence: {self.first.describe()}")
        if self.unmatched is not None:
            lines.append(f"  {'first divergence' if self.first is None else 'length'}: {self.unmatched}")
        if self.ulp_histogram:
            hist = ", ".join(f"{k}: {v}" for k, v in self.ulp_histogram.items())
            lines.append(f"  logprob ULP histogram: {hist}")
        if self.worst:
            lines.append("  worst entries:")
            lines.extend(f"    {d.describe()}" for d in self.worst)
        if self.top is not None:
            lines.extend(self.top.lines())
        return "\n".join(lines)


def compare(scenario: str, golden: ScenarioOutput, obtained: ScenarioOutput, worst: int = 5) -> GoldenDiff:
    """Compare bits entry by entry over the common prefix; a length change is a mismatch."""
    n = min(len(golden.rids), len(obtained.rids))
    labels_g, labels_o = golden.labels[:n], obtained.labels[:n]
    label_bad = np.array([a != b for a, b in zip(labels_g, labels_o)], dtype=bool)
    gt, ot = golden.tokens[:n], obtained.tokens[:n]
    gb, ob = golden.bits()[:n], obtained.bits()[:n]
    tok_bad = gt != ot
    bit_bad = gb != ob
    bad = np.flatnonzero(tok_bad | bit_bad | label_bad)
    ulps = ulp_distance(gb, ob)

    def div(i: int) -> Divergence:
        return Divergence(
            int(i),
            obtained.rids[i],
            int(obtained.positions[i]),
            int(gt[i]),
            int(ot[i]),
            int(gb[i]),
            int(ob[i]),
            int(ulps[i]),
        )

    moved = ulps[bit_bad]
    hist = bits.histogram(np.maximum(moved, 0).astype(np.uint64), moved < 0)
    # Worst: token changes first, then NaN, then by ULP distance; ties by entry order.
    severity = np.where(tok_bad, 1 << 62, np.where(ulps < 0, 1 << 61, ulps))
    order = sorted(bad.tolist(), key=lambda i: (-int(severity[i]), i))[:worst]
    return GoldenDiff(
        scenario=scenario,
        golden_n=len(golden.rids),
        obtained_n=len(obtained.rids),
        token_mismatches=int(tok_bad.sum()),
        logprob_mismatches=int(bit_bad.sum()),
        label_mismatches=int(label_bad.sum()),
        first=div(int(bad[0])) if bad.size else None,
        ulp_histogram=hist,
        worst=tuple(div(i) for i in order),
        unmatched=_unmatched(golden, obtained, n),
        top=compare_top(golden, obtained, n),
    )


def _unmatched(golden: ScenarioOutput, obtained: ScenarioOutput, n: int) -> str | None:
    """Describe entry ``n``, the first one that only the longer output has (or None)."""
    if len(golden.rids) == len(obtained.rids):
        return None
    side, out = ("golden", golden) if len(golden.rids) > n else ("obtained", obtained)
    bits = int(out.bits()[n])
    return (
        f"entry {n}: only the {side} has it: request {out.rids[n]} position "
        f"{int(out.positions[n])}: token {int(out.tokens[n])}, "
        f"logprob 0x{bits:08x} ({float_text(bits)})"
    )
