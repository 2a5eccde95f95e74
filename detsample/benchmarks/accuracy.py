"""How far each kernel family's logits are from a float64 reference, on a Llama with massive activations.

Real LLMs have massive activations: a few residual channels 10^2 - 10^4 x the rest
(Sun et al. 2024, "Massive activations in large language models"). :func:`massive_llama`
builds such a model from seeded weights: the rows of layer 0's ``down_proj`` that write
channels :data:`CHANNELS` of the residual stream are scaled by ``scale``, so from layer 1
on every token's hidden state holds those channels ``~scale`` x its median magnitude.

:func:`errors` runs one prompt through the float32 model four ways -- torch's default
kernels, the batch-invariant mode's verified and portable kernels -- and through a float64
copy without the mode (the reference), and reports the largest and the median absolute
logit error of each. The portable product is the float32 nearest to the exact dot product
(:mod:`detsample.invariant.exact`), so its products are never further from the exact
ones than float32 BLAS's; the figures show what that does to a whole model.

Run: ``python -m detsample.benchmarks.accuracy [--scales 1 30 300 3000]``.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass

import torch

CONFIG = dict(
    vocab_size=512,
    num_hidden_layers=2,
    hidden_size=128,
    intermediate_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
CHANNELS = (5, 77)  # the massive residual channels
SIDES = ("default", "verified", "portable")


def massive_llama(scale: float, seed: int = 3, **config) -> torch.nn.Module:
    """A float32 Llama (:data:`CONFIG`, or ``config``) whose residual channels
    :data:`CHANNELS` are ``scale`` x larger from layer 1 on (:func:`make_massive_`)."""
    from detsample.models.tiny import build_hf

    return make_massive_(build_hf("llama", seed, **(config or CONFIG)), scale)


def make_massive_(model: torch.nn.Module, scale: float) -> torch.nn.Module:
    """Scale the rows of layer 0's ``down_proj`` that write the residual channels
    :data:`CHANNELS` by ``scale`` (in place): those channels are then ``scale`` x the
    rest from layer 1 on, as a real LLM's massive activations are."""
    with torch.no_grad():
        for ch in CHANNELS:
            model.model.layers[0].mlp.down_proj.weight[ch] *= scale
    return model


@dataclass(frozen=True)
class Errors:
    """Absolute logit errors against the float64 reference, per side: ``largest`` and
    ``median`` (dicts keyed by :data:`SIDES`), and the measured ``ratio`` of a hidden
    state's largest magnitude to its median (median over tokens, after layer 0)."""

    scale: float
    ratio: float
    largest: dict
    median: dict


def errors(scale: float, tokens: int = 48, seed: int = 3) -> Errors:
    """The logit errors of each side on :func:`massive_llama` ``(scale)`` for a seeded
    prompt of ``tokens`` tokens."""
    from detsample.invariant import batch_invariant

    model = massive_llama(scale, seed)
    ids = torch.randint(0, CONFIG["vocab_size"], (1, tokens), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = copy.deepcopy(model).double()(ids).logits[0]
        hidden = model(ids, output_hidden_states=True).hidden_states[1][0].abs()
        ratio = float((hidden.amax(-1) / hidden.median(-1).values).median())
        logits = {"default": model(ids).logits[0]}
        for side in SIDES[1:]:
            with batch_invariant(portable=side == "portable"):
                logits[side] = model(ids).logits[0]
    err = {side: (x.double() - ref).abs() for side, x in logits.items()}
    return Errors(
        scale, ratio, {s: float(e.max()) for s, e in err.items()}, {s: float(e.median()) for s, e in err.items()}
    )


def table(rows: list[Errors]) -> str:
    """Markdown: scale, measured ratio, largest / median error per side."""
    head = "| channels x | max/median | " + " | ".join(f"{s} max | {s} median" for s in SIDES) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(SIDES))]
    for r in rows:
        cells = " | ".join(f"{r.largest[s]:.2e} | {r.median[s]:.2e}" for s in SIDES)
        lines.append(f"| {r.scale:g} | {r.ratio:.0f} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m detsample.benchmarks.accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("--scales", nargs="+", type=float, default=[1, 30, 300, 3000])
    args = p.parse_args(argv)
    print(table([errors(s) for s in args.scales]))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
