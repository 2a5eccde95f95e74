"""The input layer's file rules (detsample/inputs/files.py).

Bugs pinned: a FIFO given as an input blocked for ever in ``open``; a symlink to
``/dev/zero`` was read until the machine ran out of memory; a line or a file without end
had no bound.
"""

from __future__ import annotations

import os
import socket

import pytest

from detsample.inputs import InputError, file_problem, input_file, read_bounded, read_line


def _fifo(tmp_path):
    path = tmp_path / "in.jsonl"
    os.mkfifo(path)
    return path


def _zero_link(tmp_path):
    path = tmp_path / "in.jsonl"
    path.symlink_to("/dev/zero")
    return path


def _directory(tmp_path):
    path = tmp_path / "in.jsonl"
    path.mkdir()
    return path


def _socket(tmp_path):
    path = tmp_path / "s.jsonl"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return path


#: special files and the kind the refusal names
SPECIAL = [
    (_fifo, "a FIFO (named pipe)"),
    (_zero_link, "a character device (a symlink to /dev/zero)"),
    (_directory, "a directory"),
    (_socket, "a socket"),
]


@pytest.mark.parametrize("make,kind", SPECIAL, ids=[k for _, k in SPECIAL])
def test_a_special_file_is_named_and_refused_before_it_is_opened(tmp_path, make, kind):
    path = make(tmp_path)
    assert file_problem(path) == f"is {kind}; inputs must be regular files"
    with pytest.raises(InputError, match=f"^{path}: is "):
        input_file(path)
    with pytest.raises(InputError):
        read_bounded(path, 100)


def test_a_regular_file_and_a_symlink_to_one_are_read(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b"{}")
    link = tmp_path / "link.json"
    link.symlink_to(path)
    assert file_problem(path) is None and file_problem(link) is None
    assert read_bounded(link, 2) == b"{}"
    assert file_problem(tmp_path / "none") == "no such file"


def test_a_dash_is_not_called_a_missing_file(tmp_path, monkeypatch):
    """The bug: ``detsample audit -`` said "-: no such file"; a file named "-" is read."""
    monkeypatch.chdir(tmp_path)
    assert "standard input ('-') is not read here" in file_problem("-")
    (tmp_path / "-").write_text("x")
    assert file_problem("-") is None


def test_reads_are_bounded(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"x" * 101)
    with pytest.raises(InputError, match="larger than the 100 bytes limit"):
        read_bounded(path, 100)
    assert read_bounded(path, 101) == b"x" * 101
    path.write_bytes(b"ab\n" + b"c" * 50 + b"\n")
    with open(path, "rb") as f:
        assert read_line(f, 10, "x.bin:line 1") == b"ab\n"
        with pytest.raises(InputError, match=r"^x.bin:line 2: a line longer than the 10 bytes"):
            read_line(f, 10, "x.bin:line 2")
