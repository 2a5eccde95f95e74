"""``detsample rollout``: write RL rollouts from the continuous-batching engine in the
audit's input format (.jsonl, .npz or .parquet), so that ``detsample audit`` can be shown
end to end: ``detsample rollout r.jsonl && detsample audit r.jsonl --rescore refmodel``,
or with a float model ``detsample rollout r.jsonl --model hf-tiny-llama --batch-invariant``
then ``detsample audit r.jsonl --rescore hf-tiny-llama --batch-invariant``.

Exit codes: 0 ok, 2 bad arguments or a model that cannot be loaded.
"""

from __future__ import annotations

import argparse
import sys

from detsample.cli._argtypes import (PORTABLE_NEEDS_MODE, model_spec, portable_without_mode,
                                     positive_int, sampling_field, seed_span_problem,
                                     tp_needs_portable)
from detsample.cli._outputs import output_problem
from detsample.cli._progress import Progress
from detsample.outputs import OutputError, output_input_clash
from detsample.params import LOGPROBS_MODES

#: what ``detsample rollout`` writes (the audit also reads .pt, which rollout cannot write)
ROLLOUT_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".npz": "npz",
                   ".parquet": "parquet", ".pq": "parquet"}


def rollout_path(text: str) -> str:
    """OUT: a path ending in one of :data:`ROLLOUT_FORMATS`, else an argparse error."""
    if not any(text.lower().endswith(ext) for ext in ROLLOUT_FORMATS):
        raise argparse.ArgumentTypeError(f"{text}: unknown output format (rollout writes "
                                         f"{', '.join(ROLLOUT_FORMATS)})")
    return text


def draft_spec(text: str) -> str:
    """``--draft-model``: ``ngram`` or a model spec (:func:`model_spec`)."""
    return text if text == "ngram" else model_spec(text)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rollout", help="write rollouts from the continuous-batching engine (audit input)",
        description="Sample sequences with the continuous-batching engine and write id, "
                    "prompt_ids, response_ids, engine_logprobs, mask (and trainer_logprobs "
                    "with --with-trainer).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("out", metavar="OUT", type=rollout_path,
                   help="output file: .jsonl, .npz or .parquet")
    p.add_argument("--num-sequences", type=positive_int, default=8, metavar="N",
                   help="without --prompts: sequences, over 8 built-in prompts cycled")
    p.add_argument("--prompts", metavar="FILE",
                   help="JSONL prompts, one object per line: prompt_ids (token ids), or prompt "
                        "(text, with --tokenizer); optional id and seed")
    p.add_argument("--tokenizer", metavar="TOKENIZER_JSON",
                   help="a local Hugging Face tokenizer.json encoding the prompts' text")
    p.add_argument("--n", type=positive_int, default=1, metavar="N",
                   help="samples per prompt: sample j of prompt i uses seed SEED + i*N + j "
                        "(vLLM's child seeds: the request's seed + j); a group column names "
                        "the prompt")
    p.add_argument("--logprobs-mode", choices=list(LOGPROBS_MODES), default="raw",
                   help="engine_logprobs (and trainer_logprobs) in this mode: raw, processed "
                        "(vLLM's), scaled or processed_fixed (docs/audit.md)")
    p.add_argument("--max-new-tokens", type=sampling_field("max_new_tokens", int), default=16,
                   metavar="K", help="response length limit per sequence")
    p.add_argument("--seed", type=sampling_field("seed", int), default=0,
                   help="prompt i uses seed SEED + i*N (N: --n), unless its line gives one")
    p.add_argument("--temperature", type=sampling_field("temperature"), default=1.0,
                   help="sampling temperature")
    p.add_argument("--top-p", type=sampling_field("top_p"), default=1.0, help="nucleus filter")
    p.add_argument("--top-k", type=sampling_field("top_k", int), default=-1,
                   help="top-k filter (-1: off)")
    p.add_argument("--max-batch-size", type=positive_int, default=4, metavar="B",
                   help="engine rows at a time")
    p.add_argument("--model", default="refmodel", metavar="MODEL", type=model_spec,
                   help="refmodel, refmodel-float, hf-tiny-llama, hf-tiny-qwen2 or "
                        "package.module:factory")
    p.add_argument("--batch-invariant", action="store_true",
                   help="run the model under the batch-invariant mode (docs/batch-invariant.md)")
    p.add_argument("--portable", action="store_true",
                   help="with --batch-invariant: the mode's portable kernels (the same bits "
                        "on every CPU)")
    p.add_argument("--tp", type=positive_int, default=1, metavar="N",
                   help="run the model tensor-parallel over N local ranks (gloo; "
                        "docs/tensor-parallel.md); N > 1 under --batch-invariant needs --portable")
    p.add_argument("--draft-model", metavar="MODEL", type=draft_spec, default=None,
                   help="decode speculatively with this draft (a model spec, loaded in the "
                        "target's mode, or 'ngram' for prompt lookup): the same file, fewer "
                        "engine steps (docs/sampling.md)")
    p.add_argument("--num-speculative-tokens", type=positive_int, default=None, metavar="K",
                   help="with --draft-model: drafted tokens per step")
    p.add_argument("--with-trainer", action="store_true",
                   help="also write trainer_logprobs, recomputed by prefill")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from detsample.audit.inputs.readers import AuditInputError
    from detsample.audit.running.rollout import generate_rollouts, read_prompts
    from detsample.audit.inputs.writers import from_records, write_jsonl, write_npz, write_parquet
    from detsample.errors import DetsampleError

    if portable_without_mode(args):
        print(f"detsample rollout: error: {PORTABLE_NEEDS_MODE}", file=sys.stderr)
        return 2
    refused = tp_needs_portable(args, [args.tp]) or seed_span_problem(args.seed,
                                                                       args.num_sequences)
    if refused:
        print(f"detsample rollout: error: {refused}", file=sys.stderr)
        return 2
    if (args.draft_model is None) != (args.num_speculative_tokens is None):
        print("detsample rollout: error: --draft-model and --num-speculative-tokens go "
              "together", file=sys.stderr)
        return 2
    problem = output_problem(args.out, "OUT") or output_input_clash(
        [(args.out, "OUT")], [(args.prompts, "--prompts"), (args.tokenizer, "--tokenizer")])
    if problem:  # before the engine runs
        print(f"detsample rollout: error: {problem}", file=sys.stderr)
        return 2
    stats: list = []
    fmt = ROLLOUT_FORMATS[next(e for e in ROLLOUT_FORMATS if args.out.lower().endswith(e))]
    if args.tokenizer and not args.prompts:
        print("detsample rollout: error: --tokenizer encodes --prompts text; give --prompts FILE",
              file=sys.stderr)
        return 2
    try:
        prompts = read_prompts(args.prompts, args.tokenizer) if args.prompts else None
        with Progress("rollout: sampling") as progress:
            progress(0, None)
            records = generate_rollouts(
                args.num_sequences, max_new_tokens=args.max_new_tokens, seed=args.seed,
                temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                max_batch_size=args.max_batch_size, with_trainer=args.with_trainer,
                model=args.model, batch_invariant=args.batch_invariant, portable=args.portable,
                tp=args.tp, prompts=prompts, n=args.n, logprobs_mode=args.logprobs_mode,
                draft_model=args.draft_model,
                num_speculative_tokens=args.num_speculative_tokens or 0,
                on_speculative=stats.append)
    except (AuditInputError, DetsampleError, ValueError, OSError) as exc:
        print(f"detsample rollout: error: {exc}", file=sys.stderr)
        return 2
    writer = {"jsonl": write_jsonl, "npz": write_npz, "parquet": write_parquet}[fmt]
    try:  # atomically, at exactly OUT (detsample.outputs.write_file)
        writer(from_records(records), args.out, flag="OUT")
    except OutputError as exc:
        print(f"detsample rollout: error: {exc}", file=sys.stderr)
        return 2
    tokens = sum(len(r["response_ids"]) for r in records)
    print(f"wrote {len(records)} sequences, {tokens} response tokens to {args.out}")
    for s in stats:
        print(f"speculative: acceptance rate {s.acceptance_rate:.3f} ({s.accepted} of "
              f"{s.proposed} drafted tokens), {s.steps} verification steps")
    return 0
