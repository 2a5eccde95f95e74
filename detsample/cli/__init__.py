"""The ``detsample`` command line.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds a parser whose ``func(args) -> int`` runs it. This
file only discovers and dispatches them.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys



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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
