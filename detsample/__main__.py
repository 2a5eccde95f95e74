"""``python -m detsample`` and the ``detsample`` command: Ctrl-C handled from the first
instant (one line, exit 130), then the command line (:func:`detsample.cli.main`)."""

import os
import signal
import sys


def _interrupted_early(signum, frame):  # Ctrl-C while the package imports: one line, 130
    sys.stderr.write("detsample: interrupted (Ctrl-C)\n")
    os._exit(130)


def run() -> None:
    """The console entry point: the early Ctrl-C handler, then the command line (whose
    imports take torch's seconds; :func:`detsample.cli.main` installs its own handler)."""
    signal.signal(signal.SIGINT, _interrupted_early)
    from detsample.cli import main

    sys.exit(main())


if __name__ == "__main__":
    run()
