"""``detsample golden verify|update|diff``: manage this platform's golden files.

- ``verify``: run the scenarios and compare with the goldens on bits (exit 1 on any
  difference, a corrupt golden, or a platform without goldens);
- ``update``: regenerate the goldens atomically and print what moved (refused when the
  ``CI`` variable is set, unless ``--force``); ``--prune`` deletes goldens of scenarios
  that are no longer registered;
- ``diff``: print a unified diff of the golden files against what this build produces,
  with ``verify``'s verdict per scenario (nothing is written; exit 1 exactly when
  ``verify`` would: bits differ or a golden is corrupt; metadata is shown, not counted).

Golden files are untrusted input: a bad byte, invalid JSON, a manifest naming a file
outside the golden, a deleted manifest are ``[CORRUPT]`` lines naming file and line, and
one bad scenario never hides the others (docs/golden.md).

Every CPU shares one folder, ``golden/cpu``: the sampler's bits are defined by
detsample's own arithmetic, not by the machine (docs/golden.md). ``--isa all`` (CPU)
shows it: it runs the command once per instruction set this CPU supports (default,
avx2, avx512), each in a subprocess under ``ATEN_CPU_CAPABILITY`` -- ``update`` under the
first set, then ``verify`` under the others, so the folder is written once and every
other set must reproduce it bit for bit. ``--isa avx2`` (a comma-separated list) picks
sets.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import sys
from typing import Any

from detsample.cli._progress import Progress
from detsample.golden.format import ALL_FILES, MANIFEST


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "golden",
        help="verify, update or diff golden files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("action", choices=("verify", "update", "diff"))
    p.add_argument(
        "-k",
        "--scenario",
        action="append",
        default=None,
        metavar="NAME",
        help="only these scenarios (repeatable; default: all)",
    )
    p.add_argument("--quick", action="store_true", help="only the quick subset")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--golden-dir", default=None, metavar="PATH", help="golden root (default: golden/)")
    p.add_argument("--force", action="store_true", help="update even when CI is set")
    p.add_argument("--prune", action="store_true", help="update: delete unregistered scenarios")
    p.add_argument(
        "--isa",
        default="current",
        metavar="ISA",
        help="cpu: 'all' (every instruction set this CPU supports, each in a subprocess "
        "under ATEN_CPU_CAPABILITY), a comma-separated list, or 'current' (default)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from detsample.golden import isa, registry
    from detsample.golden.store import GoldenStore

    try:
        store = GoldenStore(args.golden_dir, device=args.device)
        selected = args.scenario or registry.names(quick=args.quick, device=args.device)
        for n in selected:
            registry.get(n)
        if args.isa != "current":
            if store.device.type != "cpu":
                raise ValueError(f"--isa applies to cpu goldens, got --device {args.device!r}")
            if args.action == "diff":
                raise ValueError("--isa applies to verify and update, got diff")
            isas = isa.resolve(args.isa)
    except (ValueError, KeyError) as e:
        print(f"detsample golden {args.action}: error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    if args.isa != "current":
        results = isa.run_per_isa(isas, _child_argv(args, args.action), print, then=_child_argv(args, "verify"))
        return max(rc for _, rc in results)
    try:
        return {"verify": _verify, "update": _update, "diff": _diff}[args.action](args, store, selected)
    except OSError as e:  # a read-only folder, a symlink loop, below a file, a size limit
        print(f"detsample golden {args.action}: error: {_write_failure(store, e)}", file=sys.stderr)
        return 2


def _child_argv(args: argparse.Namespace, action: str) -> list[str]:
    """This command as ``action`` for one instruction set (the same arguments, without
    ``--isa``; ``--force`` and ``--prune`` only for ``update``)."""
    argv = [sys.executable, "-m", "detsample", "golden", action, "--device", args.device]
    for n in args.scenario or ():
        argv += ["-k", n]
    argv += ["--quick"] * args.quick
    if action == "update":
        argv += ["--force"] * args.force + ["--prune"] * args.prune
    if args.golden_dir:
        argv += ["--golden-dir", str(args.golden_dir)]
    return argv


def _verify(args: argparse.Namespace, store: Any, selected: list[str]) -> int:
    from detsample.golden.store import verify_all

    if not store.has_platform():
        print(store.missing_platform_message(), file=sys.stderr)
        return 1
    bad = 0
    for v in verify_all(selected, args.device, store.root):
        bad += not v.ok
        print(f"[{'ok' if v.ok else v.status.upper()}] {v.message}")
    print(f"{len(selected) - bad} of {len(selected)} scenarios bit-identical to {store.platform_dir}")
    return 1 if bad else 0


def _update(args: argparse.Namespace, store: Any, selected: list[str]) -> int:
    from detsample.golden import registry
    from detsample.golden.store import ChangeKind, GoldenUpdateRefused, update_all

    try:
        with Progress(f"golden update: {len(selected)} scenarios") as progress:
            progress(0, None)
            changes = update_all(selected, args.device, store.root, force=args.force)
    except GoldenUpdateRefused as e:
        print(f"detsample golden update: error: {e}", file=sys.stderr)
        return 2
    moved = [c for c in changes if c.kind is not ChangeKind.UNCHANGED]
    for c in moved:
        print(f"[{c.kind}] {c.report}")
    print(
        f"{len(changes)} scenarios written to {store.platform_dir}: {len(moved)} changed, "
        f"{len(changes) - len(moved)} unchanged"
    )
    stale = store.stale(registry.names())
    for name in stale:
        if args.prune:
            shutil.rmtree(store.scenario_dir(name))
            print(f"[pruned] {name}")
        else:
            print(f"[stale] {name}: no longer registered (delete with --prune)")
    if moved:
        print("review with `git diff golden/` and commit the changes")
    return 0


def _write_failure(store: Any, exc: OSError) -> str:
    """One line naming the golden folder, the file and the reason of a failed write (no
    golden file changed: each is staged, then renamed)."""
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return (
        f"cannot write the goldens under {store.platform_dir}{where}: {exc.strerror or exc}; no golden file was changed"
    )


def _diff(args: argparse.Namespace, store: Any, selected: list[str]) -> int:
    """Unified diffs of the golden files against this build's, and the same verdict as
    ``verify``: a scenario differs when verify would fail it (bits, or a corrupt golden);
    a manifest whose bits-defining fields are equal is shown as metadata, not counted."""
    from detsample.golden import registry

    if not store.has_platform():
        print(store.missing_platform_message(), file=sys.stderr)
        return 1
    differ, files = 0, 0
    for name, out in registry.produce_all(selected, args.device).items():
        verdict = store.verify(name, out, write_obtained=False)
        d = store.scenario_dir(name)
        new = store.encode(name, out)
        changed = []
        for f in ALL_FILES:
            old = (d / f).read_bytes().decode("utf-8", errors="replace") if (d / f).is_file() else ""
            if old != new.get(f, ""):
                changed.append((f, old))
        if verdict.ok and not changed:
            continue
        differ += not verdict.ok
        print(f"[{'ok' if verdict.ok else verdict.status.upper()}] {verdict.message.splitlines()[0]}")
        for f, old in changed:
            if verdict.ok:
                what = "metadata" if f == MANIFEST else "formatting"
                print(f"# {name}/{f}: {what} only, every bit equal (not a difference)")
            else:
                files += 1
            sys.stdout.writelines(
                difflib.unified_diff(
                    old.splitlines(True),
                    new.get(f, "").splitlines(True),
                    fromfile=f"golden/{store.fingerprint}/{name}/{f}",
                    tofile=f"obtained/{store.fingerprint}/{name}/{f}",
                )
            )
    print(
        f"{differ} of {len(selected)} scenarios differ ({files} golden file(s))"
        if differ
        else f"no differences in the bits of {len(selected)} scenarios"
    )
    return 1 if differ else 0
