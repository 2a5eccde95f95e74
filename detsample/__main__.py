import os
import signal
import sys


def _interrupted_early(signum, frame):  # Ctrl-C while the package imports: one line, 130
    sys.stderr.write("detsample: interrupted (Ctrl-C)\n")
    os._exit(130)


signal.signal(signal.SIGINT, _interrupted_early)

from detsample.cli import main  # noqa: E402 - after the handler: torch imports for seconds

sys.exit(main())
