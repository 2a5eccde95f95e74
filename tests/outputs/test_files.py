"""The output layer's files (detsample/outputs/files.py): written whole or not at all, at
exactly the path given, never onto an input.

Bugs pinned: outputs were written in place, so a failure (``ulimit -f``, a full disk, an
exception, Ctrl-C) left a partial file where the old one was; ``np.savez`` appended
``.npz`` to ``r.NPZ``; an output equal to an input (by path, symlink or hard link)
replaced the input.
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.outputs import OutputError, output_input_clash, same_file, write_file


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_text_bytes_and_writers_land_at_exactly_the_path(tmp_path):
    write_file(tmp_path / "a.json", "é\n")
    write_file(tmp_path / "b.bin", b"\x00\xff")
    write_file(tmp_path / "r.NPZ", lambda fh: np.savez(fh, x=np.arange(3)))
    assert (tmp_path / "a.json").read_bytes() == "é\n".encode()
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.bin", "r.NPZ"]
    assert np.load(tmp_path / "r.NPZ")["x"].tolist() == [0, 1, 2]


def test_missing_folders_are_created_and_a_symlink_is_written_through(tmp_path):
    write_file(tmp_path / "new" / "deep" / "x.txt", "x")
    target = tmp_path / "target.txt"
    target.write_text("old")
    (tmp_path / "link.txt").symlink_to(target)
    write_file(tmp_path / "link.txt", "new")
    assert (tmp_path / "link.txt").is_symlink() and target.read_text() == "new"


def test_a_special_file_is_written_in_place():
    write_file("/dev/null", "nothing to lose")  # never replaced by a regular file
    assert not os.path.isfile("/dev/null")


def test_the_old_mode_is_kept(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("old")
    path.chmod(0o640)
    write_file(path, "new")
    assert (path.stat().st_mode & 0o777) == 0o640


class Boom(Exception):
    pass


FAILURES = [
    Boom("producer failed"),
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EFBIG, "File too large"),
    KeyboardInterrupt(),
]


@settings(max_examples=40, deadline=None)
@given(
    old=st.binary(max_size=2000),
    chunks=st.lists(st.binary(min_size=1, max_size=500), min_size=1, max_size=8),
    fail_at=st.integers(0, 8),
    failure=st.sampled_from(FAILURES),
)
def test_a_failure_mid_write_leaves_the_old_bytes_and_no_partial_file(tmp_path_factory, old, chunks, fail_at, failure):
    folder = tmp_path_factory.mktemp("w")
    path = folder / "out.jsonl"
    path.write_bytes(old)

    def producer(fh):
        for i, chunk in enumerate(chunks):
            if i == fail_at:
                raise failure
            fh.write(chunk)
        raise failure  # it fails after every chunk too

    with pytest.raises((Boom, OSError, KeyboardInterrupt)):
        write_file(path, producer, "--json")
    assert path.read_bytes() == old
    assert _leftovers(folder) == []


def test_an_os_error_is_one_named_output_error(tmp_path):
    def full(fh):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OutputError) as info:
        write_file(tmp_path / "r.json", full, "--json")
    assert str(info.value) == f"cannot write --json {tmp_path / 'r.json'}: No space left on device"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_named(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "x.txt").write_text("old")
    ro.chmod(0o500)
    try:
        with pytest.raises(OutputError, match="Permission denied"):
            write_file(ro / "x.txt", "new", "OUT")
    finally:
        ro.chmod(0o700)
    assert (ro / "x.txt").read_text() == "old"


@pytest.mark.parametrize("where", ["/dev/null/x.json", "loop/x.json"])
def test_below_a_device_or_in_a_symlink_loop_is_named(tmp_path, where):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    path = where if where.startswith("/") else str(tmp_path / where)
    with pytest.raises(OutputError, match=f"cannot write --json {path}: "):
        write_file(path, "{}", "--json")


def test_same_file_sees_paths_symlinks_and_hard_links(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text("x")
    (tmp_path / "sym.jsonl").symlink_to(a)
    os.link(a, tmp_path / "hard.jsonl")
    assert same_file(a, tmp_path / "sym.jsonl") and same_file(a, tmp_path / "hard.jsonl")
    assert same_file(a, tmp_path / "." / "a.jsonl")
    assert not same_file(a, tmp_path / "b.jsonl")


def test_an_output_that_is_an_input_names_both_options_and_the_path(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text("x")
    os.link(a, tmp_path / "h.jsonl")
    msg = output_input_clash([(None, "--report"), ("-", "--json"), (tmp_path / "h.jsonl", "--json")], [(a, "FILE")])
    assert msg == (
        f"--json {tmp_path / 'h.jsonl'} is the input FILE {a}: writing it would destroy the input; give another path"
    )
    assert output_input_clash([(tmp_path / "b.jsonl", "--json")], [(a, "FILE")]) is None


@settings(max_examples=20, deadline=None)
@given(old=st.binary(max_size=500), chunk=st.binary(min_size=1, max_size=200), failure=st.sampled_from(FAILURES))
def test_a_failed_append_is_cut_back_to_the_old_bytes(tmp_path_factory, old, chunk, failure):
    """Bug pinned: AuditLog.append wrote in place; a failure mid-row left half a row."""
    from detsample.outputs.files import _put

    path = tmp_path_factory.mktemp("a") / "log.jsonl"
    path.write_bytes(old)

    def flaky(fh, data):
        fh.write(chunk)
        fh.flush()
        raise failure

    import detsample.outputs.files as files

    real = files._put
    files._put = flaky
    try:
        with pytest.raises((Boom, OSError, KeyboardInterrupt)):
            files.append_file(path, b"row\n", "the audit log")
    finally:
        files._put = real
    assert path.read_bytes() == old and _put is real


def test_append_adds_whole_rows(tmp_path):
    from detsample.outputs import append_file

    append_file(tmp_path / "log.jsonl", "a\n")
    append_file(tmp_path / "log.jsonl", b"b\n")
    assert (tmp_path / "log.jsonl").read_text() == "a\nb\n"


def test_dev_stdout_redirected_to_a_file_is_written_in_place(tmp_path):
    """A path under /dev names a stream: renaming onto what it resolves to would swap the
    shell's file for another inode and lose what the command printed beside it."""
    import subprocess
    import sys

    code = (
        "from detsample.outputs import write_file; import sys; print('table', flush=True); "
        "write_file('/dev/stdout', 'json\\n', '--json')"
    )
    with open(tmp_path / "o.txt", "w") as out:
        subprocess.run([sys.executable, "-c", code], stdout=out, check=True, timeout=60)
    assert (tmp_path / "o.txt").read_text() == "table\njson\n"
