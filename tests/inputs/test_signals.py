"""Ctrl-C's scoped handling (detsample/inputs/signals.py).

Bug pinned: Ctrl-C during ``audit --workers 2`` printed a traceback from every worker
process beside the parent's (the workers got the terminal's SIGINT too).
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from detsample.errors import Interrupted
from detsample.inputs.signals import children_ignore_ctrl_c, sigint_handler


def _ignores_sigint(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigIgn:"))
    return bool(mask & (1 << (signal.SIGINT - 1)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")
@pytest.mark.parametrize("inside,ignored", [(True, True), (False, False)])
def test_processes_started_inside_ignore_ctrl_c(inside, ignored):
    def start():
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])

    if inside:
        with children_ignore_ctrl_c():
            proc = start()
    else:
        proc = start()
    try:
        assert _ignores_sigint(proc.pid) is ignored
    finally:
        proc.kill()
        proc.wait()


def test_the_previous_handler_comes_back():
    before = signal.getsignal(signal.SIGINT)

    def raise_interrupted(signum, frame):
        raise Interrupted()

    with pytest.raises(Interrupted), sigint_handler(raise_interrupted):
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
