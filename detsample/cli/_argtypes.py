"""argparse ``type=`` converters shared by the sub-commands (not a sub-command: the CLI
skips modules whose name starts with ``_``)."""

from __future__ import annotations

import argparse

from detsample.inputs.numbers import parse_float, parse_int


def positive_int(text: str) -> int:
    """An int >= 1, else an argparse error naming the value."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An int >= 0, else an argparse error naming the value."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, least: int) -> int:
    v = parse_int(text)
    if v < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {text}")
    return v


def thread_count(text: str) -> int:
    """A thread count: an int >= 1 and at most :func:`detsample.inputs.max_threads` (a count
    far beyond the machine's CPUs crashes OpenMP), else an argparse error naming it."""
    from detsample.inputs import thread_problem

    try:
        v = parse_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    problem = thread_problem(v)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return v


def add_threads_option(p: argparse.ArgumentParser) -> None:
    """``--threads N``: this process's torch intra-op threads (:func:`apply_threads`)."""
    p.add_argument(
        "--threads",
        type=thread_count,
        default=None,
        metavar="N",
        help="torch intra-op threads of this process (default: torch's, from "
        "OMP_NUM_THREADS or the CPUs); under the batch-invariant mode the "
        "bits are the same at every count",
    )


def apply_threads(args: argparse.Namespace) -> None:
    """Set ``args.threads`` (when given) with ``torch.set_num_threads``."""
    if getattr(args, "threads", None) is not None:
        import torch

        torch.set_num_threads(args.threads)


def thread_counts(text: str) -> list[int]:
    """Comma-separated thread counts (:func:`thread_count` each), e.g. ``1,2``."""
    return [thread_count(t.strip()) for t in text.split(",")]


#: seeds are in [0, 2**63) (SamplingParams.seed)
SEED_END = 1 << 63


def seed_span_problem(seed: int, count: int) -> str | None:
    """Why ``--seed SEED`` cannot give ``count`` requests the seeds SEED .. SEED + count - 1
    (the last must stay below 2**63), naming both options; or None."""
    if seed + count - 1 < SEED_END:
        return None
    return (
        f"--seed {seed} with --num-sequences {count}: request i uses seed SEED + i, so "
        f"SEED must be at most {SEED_END - count} (seeds are in [0, 2**63))"
    )


def nonneg_float(text: str) -> float:
    """A float >= 0 (NaN refused), else an argparse error naming the value."""
    v = parse_float(text)
    if not v >= 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def finite_nonneg_float(text: str) -> float:
    """A finite float >= 0 (NaN and infinity refused), else an argparse error naming it."""
    v = parse_float(text)
    if not 0.0 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v


def sampling_field(name: str, convert=float):
    """An argparse type for the SamplingParams field ``name``: the value is spelt plainly
    (:mod:`detsample.inputs.numbers`) and checked by SamplingParams and by the request's
    float32 rules (:func:`detsample.params.validation.check_float32`: the one place its
    rules live), at parse time: ``--temperature 1e-320`` never fails every row later."""
    convert = {float: parse_float, int: parse_int}.get(convert, convert)

    def parse(text: str):
        from detsample.errors import InvalidSamplingParams
        from detsample.params import SamplingParams
        from detsample.params.validation import check_float32

        try:
            v = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        try:
            check_float32("", SamplingParams(**{name: v}))
        except InvalidSamplingParams as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return v

    parse.__name__ = name
    return parse


def positive_finite(text: str) -> float:
    """A finite float > 0, else an argparse error naming the value."""
    v = parse_float(text)
    if not 0.0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


def rollout_rs(text: str) -> str | None:
    """verl's rollout_rs options (comma-separated; 'none' for none), checked at parse time."""
    if text.strip().lower() == "none":
        return None
    from detsample.audit.analysis.frameworks import parse_rollout_rs

    try:
        parse_rollout_rs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def fraction(text: str) -> float:
    """A float in [0, 1], else an argparse error naming the value."""
    v = parse_float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return v


def positive_int_list(text: str) -> list[int]:
    """Comma-separated ints >= 1 ("1,8,64"), else an argparse error naming the value."""
    try:
        values = [parse_int(t.strip()) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be integers separated by commas, got {text}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return values


def token_id_list(text: str) -> list[int]:
    """Comma-separated token ids >= 0 ("2" or "2,32000"), else an argparse error naming the
    value (``--eos-token-id``, repeatable: the lists are joined)."""
    try:
        values = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be token ids separated by commas, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"token ids must be >= 0, got {text!r}")
    return values


def model_dtype(text: str) -> str:
    """``--dtype`` of a model directory: float32, bfloat16 or float16."""
    from detsample.models import MODEL_DTYPES

    if text not in MODEL_DTYPES:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(MODEL_DTYPES)}, got {text!r}")
    return text


def model_spec(text: str) -> str:
    """A model detsample can load (``refmodel``, ``hf-tiny-llama``, ``pkg.module:factory``,
    a local Hugging Face model directory, ...; the syntax only, nothing imported or read),
    else an argparse error naming the value."""
    from detsample.models import MODEL_NAMES, is_model_spec

    if not is_model_spec(text):
        raise argparse.ArgumentTypeError(
            f"must be one of {', '.join(MODEL_NAMES)}, a model directory or package.module:factory, got {text!r}"
        )
    return text


def max_excluded(text: str):
    """``--max-excluded``: an integer count ("3") or a fraction in [0, 1] ("0.05"), as a
    :class:`detsample.audit.running.gates.ExclusionLimit`; else an argparse error naming the value."""
    from detsample.audit.running.gates import ExclusionLimit

    try:
        return ExclusionLimit.of(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


PORTABLE_NEEDS_MODE = "--portable selects the batch-invariant mode's portable kernels; give --batch-invariant too"


def portable_without_mode(args: object) -> bool:
    """Whether ``--portable`` was given without ``--batch-invariant`` (a usage error)."""
    return bool(getattr(args, "portable", False)) and not getattr(args, "batch_invariant", False)


def tp_sizes(text: str) -> list[int]:
    """``--tp`` of ``probe model``: a comma list of TP sizes (ints >= 1), else an argparse
    error naming the value."""
    try:
        sizes = [positive_int(t.strip()) for t in text.split(",")]
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"must be a comma list of TP sizes (ints >= 1), got {text!r}") from None
    return sizes


def tp_needs_portable(args: argparse.Namespace, sizes: list[int]) -> str | None:
    """The usage error of a TP size > 1 under ``--batch-invariant`` without ``--portable``
    (the verified kernels cannot give TP=1's bits), or None."""
    if any(t > 1 for t in sizes) and getattr(args, "batch_invariant", False) and not getattr(args, "portable", False):
        from detsample.parallel.layers import VERIFIED_REFUSED

        return f"--tp {','.join(map(str, sizes))}: {VERIFIED_REFUSED}"
    return None


def add_semantics_options(p: argparse.ArgumentParser, what: str) -> None:
    """--logprobs-mode, --temperature, --top-k, --top-p, --min-p: the logprob semantics
    ``what`` is computed in (None when not given: :func:`semantics_of` then means raw)."""
    from detsample.params import LOGPROBS_MODES

    p.add_argument(
        "--logprobs-mode",
        choices=list(LOGPROBS_MODES),
        metavar="MODE",
        help=f"{what} in this mode: raw (log_softmax of the logits, temperature "
        f"1; default), processed (vLLM's: log_softmax over the kept set of "
        f"logits / T), scaled (logits / T, no filter) or processed_fixed "
        f"(detsample's exact form of processed, a few ulps away)",
    )
    _add_temperature_and_filters(p, defaults=False, lead="with --logprobs-mode processed: the engine's ")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    """--temperature and every filter of the table (``--top-k``, ``--top-p``, ``--min-p``,
    ...), defaults off: the options :func:`sampling_params_of` reads."""
    _add_temperature_and_filters(p, defaults=True, lead="")


def _add_temperature_and_filters(p: argparse.ArgumentParser, *, defaults: bool, lead: str) -> None:
    """``--temperature T`` and one option per filter of the table, each help text after
    ``lead``; their defaults None (not given) or, with ``defaults``, temperature 1 and each
    filter's neutral value."""
    from detsample.params import filter_options

    p.add_argument(
        "--temperature",
        type=sampling_field("temperature"),
        default=1.0 if defaults else None,
        metavar="T",
        help=f"{lead}temperature T" + ("" if lead else " (0: greedy)"),
    )
    for o in filter_options():
        p.add_argument(
            o.flag,
            type=sampling_field(o.name, o.kind),
            default=o.neutral if defaults else None,
            metavar=o.metavar,
            help=lead + o.help,
        )


def sampling_params_of(args: argparse.Namespace):
    """The :class:`~detsample.params.SamplingParams` of :func:`add_sampling_options`'
    options (temperature and filters; the rest default)."""
    from detsample.params import SamplingParams, filter_options

    return SamplingParams(temperature=args.temperature, **{o.name: getattr(args, o.name) for o in filter_options()})


def semantics_of(args: argparse.Namespace):
    """The :class:`~detsample.audit.semantics.Semantics` of the options above, or None when
    none was given; InvalidSamplingParams for filters given with raw logprobs."""
    from detsample.audit.semantics import Semantics, filter_defaults

    given = {n: getattr(args, n) for n, _ in filter_defaults() if getattr(args, n) is not None}
    if args.logprobs_mode is None and not given:
        return None
    return Semantics.of(args.logprobs_mode or "raw", **given)
