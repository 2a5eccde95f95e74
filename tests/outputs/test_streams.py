"""The output layer's streams (detsample/outputs/streams.py).

Bugs pinned: a closed stdout (``>&-``) was an AttributeError and a broken pipe (``| true``)
a BrokenPipeError, both exit 1 (which means "a gate failed"); a non-UTF-8 file name on a
strict UTF-8 stdout was a UnicodeEncodeError after the file was written; a factory's print
landed in ``--json -``.
"""

from __future__ import annotations

import io
import sys

from detsample.outputs import data_stdout, guarded_streams
from detsample.outputs.streams import QuietStream


class Broken(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_broken_or_closed_stream_drops_writes_quietly():
    for inner in (Broken(), None):
        s = QuietStream(inner)
        assert s.write("x") == 1
        s.flush()
        assert s.broken
    closed = io.StringIO()
    closed.close()
    assert QuietStream(closed).write("abc") == 3


def test_an_unencodable_name_is_written_with_escapes():
    raw = io.BytesIO()
    strict = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
    s = QuietStream(strict)
    s.write("wrote x\udcff.jsonl\n")
    s.flush()
    assert raw.getvalue() == b"wrote x\\udcff.jsonl\n"


def test_under_data_stdout_prints_go_to_stderr(capsys):
    with guarded_streams(data=True):
        print("loading weights")
        data_stdout().write('{"ok": true}\n')
    out, err = capsys.readouterr()
    assert out == '{"ok": true}\n' and err == "loading weights\n"


def test_the_streams_are_restored(monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)
    with guarded_streams():
        print("dropped")
    assert sys.stdout is None
