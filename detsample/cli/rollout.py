"""``detsample rollout``: write RL rollouts from the continuous-batching engine in the
audit's input format (.jsonl, .npz or .parquet), so that ``detsample audit`` can be shown
end to end: ``detsample rollout r.jsonl && detsample audit r.jsonl --rescore refmodel``,
or with a float model ``detsample rollout r.jsonl --model hf-tiny-llama --batch-invariant``
then ``detsample audit r.jsonl --rescore hf-tiny-llama --batch-invariant``.

A local Hugging Face model directory works wherever a model goes (``--model DIR``,
``--draft-model DIR``; ``detsample audit --rescore DIR``), in ``--dtype`` (float32 by
default, printed). Responses end at the model's own end tokens (its config's and generation
config's ``eos_token_id``; id 0 for the reference model), ``--eos-token-id`` /
``--ignore-eos`` override them, ``--stop`` ends at a string of the decoded response; the
ending token is part of the response, nothing after it is written.

Exit codes: 0 ok, 2 bad arguments or a model that cannot be loaded.
"""

from __future__ import annotations

import argparse
import sys

from detsample.cli._argtypes import (
    PORTABLE_NEEDS_MODE,
    add_sampling_options,
    add_threads_option,
    apply_threads,
    model_dtype,
    model_spec,
    non_negative_int,
    portable_without_mode,
    positive_int,
    sampling_field,
    sampling_params_of,
    seed_span_problem,
    token_id_list,
    tp_needs_portable,
)
from detsample.cli._outputs import output_problem
from detsample.cli._progress import Progress, peak_memory_line
from detsample.outputs import OutputError, output_input_clash
from detsample.params import LOGPROBS_MODES


def rollout_path(text: str) -> str:
    """OUT: a path of a format ``detsample rollout`` writes (the format table,
    :data:`detsample.audit.inputs.formats.FORMATS`: .pt is read, not written), else an
    argparse error."""
    from detsample.audit.inputs.formats import format_of
    from detsample.audit.issues import AuditInputError

    try:
        format_of(text, written=True)
    except AuditInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def draft_spec(text: str) -> str:
    """``--draft-model``: ``ngram`` or a model spec (:func:`model_spec`)."""
    return text if text == "ngram" else model_spec(text)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rollout",
        help="write rollouts from the continuous-batching engine (audit input)",
        description="Sample sequences with the continuous-batching engine and write id, "
        "prompt_ids, response_ids, engine_logprobs, mask (and trainer_logprobs "
        "with --with-trainer).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("out", metavar="OUT", type=rollout_path, help="output file: .jsonl, .npz or .parquet")
    p.add_argument(
        "--num-sequences",
        type=positive_int,
        default=8,
        metavar="N",
        help="without --prompts: sequences, over 8 built-in prompts cycled",
    )
    p.add_argument(
        "--prompts",
        metavar="FILE",
        help="JSONL prompts, one object per line: prompt_ids (token ids), or prompt "
        "(text, with --tokenizer); optional id and seed",
    )
    p.add_argument(
        "--tokenizer",
        metavar="TOKENIZER",
        help="a local Hugging Face tokenizer.json (or a model directory) encoding the "
        "prompts' text and decoding responses for --stop; default: --model's "
        "directory",
    )
    p.add_argument(
        "--chat-template",
        action="store_true",
        help="prompt lines may give messages ([{role, content}, ...]), rendered by "
        "the tokenizer's own chat template with the generation prompt",
    )
    _add_ending_options(p)
    p.add_argument(
        "--n",
        type=positive_int,
        default=1,
        metavar="N",
        help="samples per prompt: sample j of prompt i uses seed SEED + i*N + j "
        "(vLLM's child seeds: the request's seed + j); a group column names "
        "the prompt",
    )
    p.add_argument(
        "--logprobs-mode",
        choices=list(LOGPROBS_MODES),
        default="raw",
        help="engine_logprobs (and trainer_logprobs) in this mode: raw, processed "
        "(vLLM's), scaled or processed_fixed (docs/audit.md)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=sampling_field("max_new_tokens", int),
        default=16,
        metavar="K",
        help="response length limit per sequence",
    )
    p.add_argument(
        "--seed",
        type=sampling_field("seed", int),
        default=0,
        help="prompt i uses seed SEED + i*N (N: --n), unless its line gives one",
    )
    add_sampling_options(p)
    p.add_argument("--max-batch-size", type=positive_int, default=4, metavar="B", help="engine rows at a time")
    p.add_argument(
        "--stagger",
        type=non_negative_int,
        default=0,
        metavar="K",
        help="request k arrives at engine step k*K (default 0: every request waits "
        "at step 0 and the engine admits up to B at once, then one as each "
        "finishes); a row's tokens do not depend on it",
    )
    p.add_argument(
        "--model",
        default="refmodel",
        metavar="MODEL",
        type=model_spec,
        help="refmodel, refmodel-float, hf-tiny-llama, hf-tiny-qwen2, a local "
        "Hugging Face model directory or package.module:factory",
    )
    p.add_argument(
        "--dtype",
        type=model_dtype,
        default="float32",
        help="a model directory's parameter dtype: float32, bfloat16 or float16",
    )
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="run the model under the batch-invariant mode (docs/batch-invariant.md)",
    )
    p.add_argument(
        "--portable",
        action="store_true",
        help="with --batch-invariant: the mode's portable kernels (the same bits on every CPU)",
    )
    p.add_argument(
        "--tp",
        type=positive_int,
        default=1,
        metavar="N",
        help="run the model tensor-parallel over N local ranks (gloo; "
        "docs/tensor-parallel.md); N > 1 under --batch-invariant needs --portable",
    )
    p.add_argument(
        "--draft-model",
        metavar="MODEL",
        type=draft_spec,
        default=None,
        help="decode speculatively with this draft (a model spec, loaded in the "
        "target's mode, or 'ngram' for prompt lookup): the same file, fewer "
        "engine steps (docs/sampling.md)",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=positive_int,
        default=None,
        metavar="K",
        help="with --draft-model: drafted tokens per step",
    )
    add_threads_option(p)
    p.add_argument("--with-trainer", action="store_true", help="also write trainer_logprobs, recomputed by prefill")
    p.set_defaults(func=run)


def _add_ending_options(p: argparse.ArgumentParser) -> None:
    """How responses end: EOS ids, stop ids, stop strings."""
    p.add_argument(
        "--eos-token-id",
        type=token_id_list,
        action="append",
        default=None,
        metavar="ID[,ID...]",
        help="end-of-sequence ids, repeatable (default: the model's own: its "
        "config's and generation config's eos_token_id; 0 for refmodel)",
    )
    p.add_argument(
        "--ignore-eos", action="store_true", help="do not stop at end-of-sequence ids (stop ids and strings still stop)"
    )
    p.add_argument(
        "--stop-token-id",
        type=token_id_list,
        action="append",
        default=None,
        metavar="ID[,ID...]",
        help="each request's stop_token_ids, repeatable",
    )
    p.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="stop string, repeatable: the response ends with the token that completes it (needs a tokenizer)",
    )


def _text_tokenizer(args: argparse.Namespace) -> str | None:
    """--tokenizer, else --model when it is a directory."""
    from detsample.models import is_model_dir_spec

    if args.tokenizer:
        return args.tokenizer
    return args.model if is_model_dir_spec(args.model) else None


def _model_line(args: argparse.Namespace) -> str:
    """``model: SPEC``, with the dtype for a model directory (the others state their own)."""
    from detsample.models import is_model_dir_spec

    return f"model: {args.model}" + (f" ({args.dtype})" if is_model_dir_spec(args.model) else "")


def _ending(args: argparse.Namespace, tokenizer: str | None):
    from detsample.audit.running.rollout import Ending

    join = lambda lists: None if lists is None else tuple(t for ids in lists for t in ids)
    return Ending(
        eos_token_ids=join(args.eos_token_id),
        ignore_eos=args.ignore_eos,
        stop_token_ids=join(args.stop_token_id) or (),
        stop=tuple(args.stop or ()),
        tokenizer=tokenizer,
    )


#: bytes a response token's record takes until the file is written (ids, logprobs and
#: mask as Python lists: ~4 objects of 40-70 bytes), and a sequence's own
RECORD_TOKEN_BYTES, RECORD_BYTES = 256, 2048


def _records_memory_problem(args: argparse.Namespace, prompts: int) -> str | None:
    """Why the rollout's records (held in memory until OUT is written) would not fit: the
    options that size them named; else None."""
    from detsample.inputs import memory_problem

    sequences = prompts * args.n
    need = sequences * (args.max_new_tokens * RECORD_TOKEN_BYTES + RECORD_BYTES)
    what = (
        f"{sequences:,} sequences ({'--prompts' if args.prompts else '--num-sequences'} x --n) "
        f"of up to --max-new-tokens {args.max_new_tokens}, held in memory until written,"
    )
    problem = memory_problem(need, what)
    return problem and f"{problem}; split the rollout into several runs (--seed, --prompts)"


def _refusal(args: argparse.Namespace) -> str | None:
    """What the arguments refuse before anything loads, else None."""
    if portable_without_mode(args):
        return PORTABLE_NEEDS_MODE
    refused = tp_needs_portable(args, [args.tp]) or seed_span_problem(args.seed, args.num_sequences)
    if refused:
        return refused
    if (args.draft_model is None) != (args.num_speculative_tokens is None):
        return "--draft-model and --num-speculative-tokens go together"
    if args.tokenizer and not args.prompts and not args.stop:
        return "--tokenizer encodes --prompts text (or decodes for --stop); give --prompts FILE"
    if args.chat_template and not args.prompts:
        return "--chat-template renders --prompts messages; give --prompts FILE"
    return output_problem(args.out, "OUT") or output_input_clash(  # before the engine runs
        [(args.out, "OUT")], [(args.prompts, "--prompts"), (args.tokenizer, "--tokenizer")]
    )


def run(args: argparse.Namespace) -> int:
    from detsample.audit.inputs.formats import format_of
    from detsample.audit.inputs.readers import AuditInputError
    from detsample.audit.inputs.writers import from_records
    from detsample.audit.running.rollout import generate_rollouts, read_prompts
    from detsample.errors import DetsampleError

    refused = _refusal(args)
    if refused:
        print(f"detsample rollout: error: {refused}", file=sys.stderr)
        return 2
    stats: list = []
    writer = format_of(args.out, written=True).writer
    tokenizer = _text_tokenizer(args)
    apply_threads(args)
    print(_model_line(args))
    try:
        ending = _ending(args, tokenizer)
        prompts = read_prompts(args.prompts, tokenizer, chat_template=args.chat_template) if args.prompts else None
        too_big = _records_memory_problem(args, len(prompts) if prompts else args.num_sequences)
        if too_big:  # before the model loads
            raise ValueError(too_big)
        with Progress("rollout") as progress:
            progress(0, None)
            records = generate_rollouts(
                args.num_sequences,
                max_new_tokens=args.max_new_tokens,
                seed=args.seed,
                sampling=sampling_params_of(args),
                max_batch_size=args.max_batch_size,
                stagger=args.stagger,
                with_trainer=args.with_trainer,
                model=args.model,
                batch_invariant=args.batch_invariant,
                portable=args.portable,
                tp=args.tp,
                prompts=prompts,
                n=args.n,
                logprobs_mode=args.logprobs_mode,
                draft_model=args.draft_model,
                num_speculative_tokens=args.num_speculative_tokens or 0,
                on_speculative=stats.append,
                ending=ending,
                dtype=args.dtype,
                on_eos=lambda eos: print(f"eos token ids: {list(eos) or 'none'}"),
                on_progress=progress,
            )
    except (AuditInputError, DetsampleError, ValueError, OSError) as exc:
        print(f"detsample rollout: error: {exc}", file=sys.stderr)
        return 2
    try:  # atomically, at exactly OUT (detsample.outputs.write_file)
        writer(from_records(records), args.out, flag="OUT")
    except OutputError as exc:
        print(f"detsample rollout: error: {exc}", file=sys.stderr)
        return 2
    tokens = sum(len(r["response_ids"]) for r in records)
    print(f"wrote {len(records)} sequences, {tokens} response tokens to {args.out}")
    memory = peak_memory_line()
    if memory is not None:
        print(memory)
    for s in stats:
        print(
            f"speculative: acceptance rate {s.acceptance_rate:.3f} ({s.accepted} of "
            f"{s.proposed} drafted tokens), {s.steps} verification steps"
        )
    return 0
