"""Progress off a terminal (detsample/cli/_progress.py): plain lines with rate and ETA for
long work, nothing for short work; the rollout's progress counts finished sequences.

Pins: a long rollout or audit that printed nothing between loading and the end when
stderr was not a terminal (10-37 minutes of silence in a CI log); progress lines that
would have broken the byte-identical stderr of short runs.
"""

from __future__ import annotations

import io
import re

from detsample.audit.running.rollout import generate_rollouts
from detsample.cli._progress import Progress


def test_long_work_off_a_terminal_writes_lines_with_rate_and_eta():
    stream = io.StringIO()  # not a terminal
    with Progress("rollout", stream, every=0.0) as progress:
        for i in range(1, 4):
            progress(i, 8, "sequences sampled")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4  # one a call (every=0), and the last at the end
    assert re.fullmatch(r"rollout: 1/8 sequences sampled, [0-9.]+/s, ETA [0-9]+ s \([0-9]+ s\)", lines[0])
    assert lines[-1].startswith("rollout: 3/8 sequences sampled")


def test_short_work_off_a_terminal_writes_nothing():
    stream = io.StringIO()
    with Progress("rollout", stream, every=3600.0) as progress:
        for i in range(1, 9):
            progress(i, 8, "sequences sampled")
    assert stream.getvalue() == ""


def test_an_unknown_total_has_no_eta():
    stream = io.StringIO()
    with Progress("audit --rescore", stream, every=0.0) as progress:
        progress(5, None, "sequences rescored")
    assert "ETA" not in stream.getvalue() and "audit --rescore: 5 sequences rescored" in stream.getvalue()


def test_the_rollout_reports_each_finished_sequence():
    seen = []
    records = generate_rollouts(
        num_sequences=4, max_new_tokens=3, seed=2, max_batch_size=2, on_progress=lambda *a: seen.append(a)
    )
    assert len(records) == 4
    assert seen == [(k, 4, "sequences sampled") for k in range(1, 5)]


def test_the_peak_memory_line_states_megabytes(tmp_path, capsys):
    """``detsample rollout`` ends with the process's peak resident memory (the bug: 2.4-2.8
    GB for a 540 MB model, and nothing said it)."""
    from detsample.cli import main

    assert main(["rollout", str(tmp_path / "r.jsonl"), "--num-sequences", "2", "--max-new-tokens", "2"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(r"peak memory: [1-9][0-9]* MB resident", last), last
