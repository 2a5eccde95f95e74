"""The ``detsample`` command line.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds a parser whose ``func(args) -> int`` runs it. This
file discovers and dispatches them, and holds the exit codes every command shares:

* 0: done, every gate held; 1: a gate or check failed (named); 2: bad input or usage (one
  ``detsample COMMAND: error:`` line naming the file, row, field or option and the value);
* 130: interrupted by Ctrl-C (one line, no traceback).

Every command runs inside :func:`detsample.outputs.guarded_streams`: a closed or broken
stdout or stderr (``--json - | true``, ``>&-``) drops what is written to it and the command
keeps its exit code; a name the stream cannot encode is written with backslash escapes;
under ``--json -`` whatever the command (or a user's factory) prints goes to stderr and
stdout holds the JSON alone.

Before any command runs (and any torch kernel), ``ATEN_CPU_CAPABILITY`` must be unset,
empty or exactly a set this CPU runs (:func:`detsample.golden.isa.forced_isa_problem`):
torch would dispatch a forced set's kernels on a CPU that lacks it and die on an illegal
instruction, with no output, and would ignore a value it does not know; either is refused
with exit 2 and one line naming the variable, its value and the CPU's sets.

A :class:`~detsample.errors.DetsampleError` a command does not catch itself, a
``SystemExit`` or ``KeyboardInterrupt`` raised by code the command ran (a user's model,
never a real Ctrl-C) and running out of memory end here as exit 2 with one line: a
command never exits 0 on work it did not do.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from detsample.errors import DetsampleError, Interrupted
from detsample.golden.isa import forced_isa_problem
from detsample.inputs.signals import sigint_handler
from detsample.outputs import guarded_streams, stdout_is_data

#: the exit status of a command interrupted by Ctrl-C (128 + SIGINT, the shell's)
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="detsample",
        description="Deterministic-inference reproducibility harness for LLM sampling.",
    )
    from detsample.version import __version__

    parser.add_argument("--version", action="version", version=f"detsample {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"detsample.cli.{info.name}")
        module.register(sub)
    return parser


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted()


def _one_line(exc: BaseException) -> str:
    return "; ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip()) or type(exc).__name__


def run_command(args: argparse.Namespace) -> int:
    """``args.func(args)`` with the shared exit codes (module docstring)."""
    with guarded_streams(data=stdout_is_data(args)):  # never a traceback from a stream
        return _run_guarded(args)


def _run_guarded(args: argparse.Namespace) -> int:
    name = f"detsample {args.command}"
    try:
        return int(args.func(args) or 0)
    except Interrupted:
        print(f"{name}: interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt as exc:
        why = f": {_one_line(exc)}" if str(exc) else ""
        print(
            f"{name}: error: code run by this command raised KeyboardInterrupt{why} "
            f"(not a Ctrl-C); nothing was completed",
            file=sys.stderr,
        )
        return 2
    except SystemExit as exc:
        print(
            f"{name}: error: code run by this command called sys.exit({exc.code!r}); nothing was completed",
            file=sys.stderr,
        )
        return 2
    except DetsampleError as exc:
        print(f"{name}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"{name}: error: out of memory (an input or an option larger than this machine holds)", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """Run ``detsample ARGV``; refuse a forced instruction set first (module docstring)."""
    problem = forced_isa_problem()
    if problem is not None:
        print(f"detsample: error: {problem}", file=sys.stderr)
        return 2
    with sigint_handler(_raise_interrupted):  # Ctrl-C told apart from code's interrupts
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
        except Interrupted:
            print("detsample: interrupted (Ctrl-C)", file=sys.stderr)
            return EXIT_INTERRUPTED
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        #: the command as given, for reports that must say what made them
        args.command_line = ["detsample", *(sys.argv[1:] if argv is None else argv)]
        return run_command(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
