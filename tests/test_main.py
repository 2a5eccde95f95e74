"""detsample/__main__.py: Ctrl-C at any moment of a command is one line and exit 130 --
also in its first second, while torch imports (the bug: ``python -m detsample`` imported
torch through the package before any handler, so an early Ctrl-C was a
KeyboardInterrupt traceback)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import detsample


def test_importing_the_package_does_not_import_torch():
    code = "import sys, detsample; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert out.stdout.strip() == "False"


def test_public_names_resolve_lazily_and_unknown_ones_fail():
    assert detsample.Sampler.__name__ == "Sampler"
    assert set(detsample.__all__) <= set(dir(detsample))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        detsample.nope  # noqa: B018


def _wait_for_torch_loading(pid: int, timeout: float = 60.0) -> None:
    """Until process ``pid`` maps torch's library (Linux: /proc/PID/maps), i.e. it is inside
    torch's import -- after the interpreter's own start-up, whose SIGINT no program can
    handle; elsewhere a short sleep."""
    maps = f"/proc/{pid}/maps"
    if not os.path.exists(maps):
        time.sleep(0.5)
        return
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(maps) as f:
                if "libtorch" in f.read():
                    return
        except OSError:  # the process ended
            return
        time.sleep(0.002)


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_ctrl_c_while_the_command_imports_is_one_line_and_130(delay):
    proc = subprocess.Popen(
        [sys.executable, "-m", "detsample", "check", "--quick"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    _wait_for_torch_loading(proc.pid)
    time.sleep(delay)  # 0: as torch's libraries load; 0.3: later in the import
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and err.strip().endswith("interrupted (Ctrl-C)"), err
    assert len(err.strip().splitlines()) == 1, err
