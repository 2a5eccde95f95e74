"""Golden files are untrusted input (detsample/golden/store.py, format.py, cli/golden.py).

Bugs pinned: a manifest whose ``file`` named a missing file or
``../random.top_k/logprobs.txt`` verified ``[ok]``; a non-UTF-8 byte ended ``golden verify``
and ``golden diff`` in a UnicodeDecodeError traceback and the other scenarios went
unreported; ``golden diff`` exited 1 on untouched goldens where ``verify`` exited 0 (it
counted manifest metadata); a deleted manifest read ``[MISSING-SCENARIO]`` (and a folder of
deleted manifests was a skipped platform).
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

#: examples per fuzz test: a fixed, bounded set in the default suite; set
#: DETSAMPLE_FUZZ_EXAMPLES=2000 for a longer, randomised local run
FUZZ_EXAMPLES = int(os.environ.get("DETSAMPLE_FUZZ_EXAMPLES", 60))
FUZZ_FIXED = "DETSAMPLE_FUZZ_EXAMPLES" not in os.environ

from detsample.cli import main
from detsample.golden.store import CORRUPT, OK, GoldenStore
from detsample.golden.tensor_store import TensorGoldens

NAMES = ["random.greedy", "random.min_p", "random.top_k"]
SEL = [a for n in NAMES for a in ("-k", n)]


@pytest.fixture
def goldens(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("CI", raising=False)
    assert main(["golden", "update", *SEL, "--golden-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    return tmp_path, GoldenStore(tmp_path)


def _edit_manifest(store, name, edit):
    path = store.scenario_dir(name) / "manifest.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc, sort_keys=True, indent=1) + "\n")


def _spoil(store, name, fname, at=10, junk=b"\xff\xfe"):
    path = store.scenario_dir(name) / fname
    data = path.read_bytes()
    path.write_bytes(data[:at] + junk + data[at + len(junk) :])


def _run(capsys, action, root):
    rc = main(["golden", action, *SEL, "--golden-dir", str(root)])
    return rc, capsys.readouterr().out


FILE_REFS = [
    ("../random.top_k/logprobs.txt", "points outside the scenario folder"),
    ("/etc/passwd", "points outside the scenario folder"),
    ("missing.txt", "names 'missing.txt'; the format keeps it in 'logprobs.txt'"),
    ("tokens.txt", "names 'tokens.txt'; the format keeps it in 'logprobs.txt'"),
    (None, "arrays.logprobs.file must be 'logprobs.txt', got None"),
]


@pytest.mark.parametrize("ref,text", FILE_REFS)
def test_manifest_file_references_stay_in_the_folder(goldens, capsys, ref, text):
    root, store = goldens
    _edit_manifest(store, "random.min_p", lambda d: d["arrays"]["logprobs"].__setitem__("file", ref))
    for action in ("verify", "diff"):
        rc, out = _run(capsys, action, root)
        assert rc == 1, action
        assert "[CORRUPT] random.min_p: golden files are corrupt: manifest.json: " in out
        assert text in out
        if action == "verify":
            assert "[ok] random.greedy" in out and "[ok] random.top_k" in out


SPOILS = [
    ("tokens.txt", 10, "tokens.txt:"),
    ("logprobs.txt", 40, "logprobs.txt:"),
    ("manifest.json", 30, "manifest.json:"),
]


@pytest.mark.parametrize("fname,at,where", SPOILS)
def test_a_bad_byte_is_a_corrupt_line_naming_file_and_line(goldens, capsys, fname, at, where):
    root, store = goldens
    _spoil(store, "random.min_p", fname, at)
    data = (store.scenario_dir("random.min_p") / fname).read_bytes()
    line = data[:at].count(b"\n") + 1
    for action in ("verify", "diff"):
        rc, out = _run(capsys, action, root)
        assert rc == 1
        assert (
            f"[CORRUPT] random.min_p: golden files are corrupt: {where}{line}: not UTF-8 (byte 0xff at column" in out
        ), out
    rc, out = _run(capsys, "verify", root)  # the others are still reported
    assert "[ok] random.greedy" in out and "[ok] random.top_k" in out
    assert "2 of 3 scenarios bit-identical" in out


@pytest.mark.parametrize(
    "fname,col,value,kind",
    [
        ("tokens.txt", 0, "99999999999999999999999", "int64"),
        ("logprobs.txt", 0, "1ffffffffffffffffff", "uint64"),
    ],
)
def test_a_bad_integer_names_its_own_file_and_line(goldens, capsys, fname, col, value, kind):
    """The bug: an id overflowing int64 in tokens.txt was reported as a "non-integer value"
    of logprobs.txt, with no line."""
    root, store = goldens
    path = store.scenario_dir("random.min_p") / fname
    lines = path.read_text().splitlines(keepends=True)
    words = lines[2].split(" ")
    words[col] = value
    lines[2] = " ".join(words)
    path.write_text("".join(lines))
    rc, out = _run(capsys, "verify", root)
    assert (
        rc == 1
        and (f"[CORRUPT] random.min_p: golden files are corrupt: {fname}:3: not an {kind} in golden text: '{value}'")
        in out
    ), out


def test_invalid_json_names_the_line(goldens, capsys):
    root, store = goldens
    path = store.scenario_dir("random.top_k") / "manifest.json"
    path.write_text(path.read_text().replace('"arrays"', '"arrays" "', 1))
    rc, out = _run(capsys, "verify", root)
    assert (
        rc == 1
        and "[CORRUPT] random.top_k: golden files are corrupt: manifest.json:2: "
        "invalid JSON: Expecting ':' delimiter (column"
        in out
    )


def test_verify_and_diff_agree_metadata_is_shown_not_counted(goldens, capsys):
    root, store = goldens
    _edit_manifest(
        store,
        "random.greedy",
        lambda d: d.update(cpu_dispatch={"machine_isa": "elsewhere", "mode": "emulated"}, library_version="0.0"),
    )
    rc_v, _ = _run(capsys, "verify", root)
    rc_d, out = _run(capsys, "diff", root)
    assert rc_v == rc_d == 0
    assert "# random.greedy/manifest.json: metadata only, every bit equal" in out
    assert '-  "machine_isa": "elsewhere"' in out
    assert "no differences in the bits of 3 scenarios" in out
    _edit_manifest(
        store, "random.greedy", lambda d: d["arrays"]["tokens"].__setitem__("dtype", "<i4")
    )  # a field that gives the bits their meaning: a difference
    assert _run(capsys, "verify", root)[0] == 1 and _run(capsys, "diff", root)[0] == 1


def test_a_deleted_manifest_is_corrupt_not_missing(goldens, capsys):
    root, store = goldens
    (store.scenario_dir("random.top_k") / "manifest.json").unlink()
    for action in ("verify", "diff"):
        rc, out = _run(capsys, action, root)
        assert rc == 1 and "[CORRUPT] random.top_k:" in out and "MISSING" not in out
        assert "manifest.json: missing while tokens.txt, logprobs.txt are present" in out
    for n in NAMES:  # every manifest gone: still this platform's (broken) goldens, no skip
        (store.scenario_dir(n) / "manifest.json").unlink(missing_ok=True)
    assert store.has_platform()
    rc, out = _run(capsys, "verify", root)
    assert rc == 1 and out.count("[CORRUPT]") == 3


def test_verify_api_reports_corrupt(goldens):
    _, store = goldens
    _spoil(store, "random.top_k", "logprobs.txt")
    from detsample.golden import registry

    out = registry.produce_all(["random.top_k", "random.greedy"])
    assert store.verify("random.top_k", out["random.top_k"], write_obtained=False).status == CORRUPT
    assert store.verify("random.greedy", out["random.greedy"], write_obtained=False).status == OK


def test_tensor_goldens_are_untrusted_too(tmp_path, monkeypatch):
    import numpy as np

    from detsample.golden.store import MISSING_SCENARIO

    monkeypatch.delenv("CI", raising=False)
    goldens = TensorGoldens(GoldenStore(tmp_path))
    tensors = {"x": np.arange(4, dtype=np.float32)}
    goldens.update("k", tensors)
    assert goldens.verify("k", tensors).ok
    d = goldens.golden_dir("k")
    data = (d / "x.txt").read_bytes()
    (d / "x.txt").write_bytes(data[:-5] + b"\xff" + data[-4:])
    v = goldens.verify("k", tensors, write_obtained=False)
    assert v.status == CORRUPT and "x.txt:5: not UTF-8 (byte 0xff" in v.message
    goldens.update("k", tensors)
    (d / "manifest.json").unlink()
    v = goldens.verify("k", tensors, write_obtained=False)
    assert v.status == CORRUPT and "manifest.json: missing while the tensor files" in v.message
    assert goldens.verify("other", tensors, write_obtained=False).status == MISSING_SCENARIO


@pytest.fixture(scope="module")
def one_golden(tmp_path_factory):
    import os

    from detsample.golden import registry

    old = os.environ.pop("CI", None)
    try:
        root = tmp_path_factory.mktemp("golden_fuzz")
        out = registry.produce_all(["random.greedy"])
        GoldenStore(root).update(out)
    finally:
        if old is not None:
            os.environ["CI"] = old
    return root, out["random.greedy"]


_FILES = ["tokens.txt", "logprobs.txt", "manifest.json"]


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=FUZZ_FIXED,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    edits=st.lists(
        st.tuples(
            st.sampled_from(_FILES),
            st.integers(0, 10**6),
            st.sampled_from(["flip", "cut", "insert", "drop"]),
            st.integers(0, 255),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_fuzzed_goldens_are_verified_never_crash(one_golden, tmp_path_factory, edits):
    """Random byte edits of a golden's files: verify never raises and never reports a
    status it does not define; a golden whose token or logprob text lost a byte, or any
    file a non-UTF-8 byte, is never ok."""
    import shutil

    src, out = one_golden
    root = tmp_path_factory.mktemp("g")
    shutil.copytree(src, root, dirs_exist_ok=True)
    store = GoldenStore(root)
    d = store.scenario_dir("random.greedy")
    must_fail = False
    for fname, at, how, byte in edits:
        if not (d / fname).exists():
            continue
        data = (d / fname).read_bytes()
        at %= max(len(data), 1)
        if how == "flip":
            data = data[:at] + bytes([byte]) + data[at + 1 :]
            must_fail |= byte >= 0x80
        elif how == "cut":
            must_fail |= fname != "manifest.json" and at < len(data) - 1
            data = data[:at]
        elif how == "insert":
            data = data[:at] + bytes([byte]) + data[at:]
            must_fail |= byte >= 0x80
        else:
            (d / fname).unlink()
            must_fail = True
            continue
        (d / fname).write_bytes(data)
    v = store.verify("random.greedy", out, write_obtained=False)
    assert v.status in {"ok", "mismatch", "corrupt", "missing-scenario"}, v
    if must_fail:
        assert not v.ok, (edits, v.message)


# Bugs pinned: a manifest whose cpu_dispatch.mkl (or vml) was a list or an object crashed
# `golden verify`, `golden diff` and `check` for every scenario (unhashable type in the MKL
# pin); a golden file that was a FIFO blocked for ever, one symlinked to /dev/zero was read
# until the machine ran out of memory.

DISPATCH = [("mkl", ["x"]), ("vml", {"a": 1}), ("mode", 3), ("machine_isa", None)]


@pytest.mark.parametrize("field,value", DISPATCH, ids=[f for f, _ in DISPATCH])
def test_a_malformed_cpu_dispatch_is_that_scenario_s_corrupt_line(goldens, capsys, field, value):
    root, store = goldens
    _edit_manifest(store, "random.min_p", lambda d: d.setdefault("cpu_dispatch", {}).__setitem__(field, value))
    for action in ("verify", "diff"):
        rc, out = _run(capsys, action, root)
        assert rc == 1, out
        assert (
            f"[CORRUPT] random.min_p: golden files are corrupt: manifest.json: "
            f"cpu_dispatch.{field} must be a string, got {value!r}" in out
        ), out
    rc, out = _run(capsys, "verify", root)
    assert "[ok] random.greedy" in out and "[ok] random.top_k" in out


def test_a_cpu_dispatch_that_is_not_an_object_is_corrupt(goldens, capsys):
    root, store = goldens
    _edit_manifest(store, "random.top_k", lambda d: d.__setitem__("cpu_dispatch", [1]))
    rc, out = _run(capsys, "verify", root)
    assert rc == 1 and "cpu_dispatch must be an object, got [1]" in out
    assert "[ok] random.greedy" in out and "[ok] random.min_p" in out


def _replace(path, how):
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
        return "a FIFO (named pipe)"
    if how == "device":
        path.symlink_to("/dev/zero")
        return "a character device (a symlink to /dev/zero)"
    path.mkdir()
    return "a directory"


@pytest.mark.parametrize("fname", ["manifest.json", "logprobs.txt"])
@pytest.mark.parametrize("how", ["fifo", "device", "directory"])
def test_a_golden_file_that_is_not_a_regular_file_is_corrupt(goldens, capsys, fname, how):
    from tests.helpers import run_bounded

    root, store = goldens
    path = store.scenario_dir("random.min_p") / fname
    kind = _replace(path, how)
    rc = run_bounded(["golden", "verify", *SEL, "--golden-dir", str(root)], [path] if how == "fifo" else [])
    out = capsys.readouterr().out
    assert rc == 1 and f"[CORRUPT] random.min_p: golden files are corrupt: {path}: is {kind}" in out, out
    assert "[ok] random.greedy" in out and "[ok] random.top_k" in out


@pytest.mark.parametrize("field,value", DISPATCH, ids=[f for f, _ in DISPATCH])
def test_check_s_readers_of_cpu_dispatch_skip_a_malformed_one(goldens, field, value):
    """What `check` reads before its battery (the header line's provenance) never raises
    on a malformed manifest; the battery's golden check names it."""
    from detsample.cli.check import golden_source
    from detsample.golden import isa

    root, store = goldens
    _edit_manifest(store, "random.min_p", lambda d: d.setdefault("cpu_dispatch", {}).__setitem__(field, value))
    recorded = isa.recorded_dispatch(store.platform_dir)
    assert all(isinstance(d.get(field, ""), str) for d in recorded)
    assert golden_source(store).startswith("this run: ")


@pytest.mark.parametrize("how", ["file", "fifo", "device"])
@pytest.mark.parametrize("command", [["golden", "verify", "-k", "random.greedy"], ["check"]])
def test_a_golden_root_that_is_not_a_folder_is_a_usage_error(tmp_path, capsys, how, command):
    """Bug pinned: ``--golden-dir`` naming a file, a FIFO or /dev/zero read as a platform
    without goldens (exit 1, "NO GOLDEN FILES ... under /dev/zero")."""
    from tests.helpers import run_bounded

    root = tmp_path / "root"
    if how == "file":
        root.write_text("{}")
    elif how == "fifo":
        os.mkfifo(root)
    else:
        root.symlink_to("/dev/zero")
    rc = run_bounded([*command, "--golden-dir", str(root)], [root] if how == "fifo" else [])
    err = capsys.readouterr().err
    assert rc == 2 and f"golden root {root} is a" in err and "not a directory" in err, err


def test_an_unreadable_golden_folder_is_not_called_missing(goldens, capsys, monkeypatch):
    """The bug: a golden folder that cannot be listed looked empty to ``glob``, and verify
    said "NO GOLDEN FILES ... create them" (regenerating over goldens that exist)."""
    import os

    root, store = goldens
    real = os.scandir

    def scandir(path="."):
        if os.fspath(path) == os.fspath(store.platform_dir):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    real_glob = type(store.platform_dir).glob
    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(
        type(store.platform_dir),
        "glob",
        lambda self, pat: iter(()) if self == store.platform_dir else real_glob(self, pat),
    )
    rc = main(["golden", "verify", *SEL, "--golden-dir", str(root)])
    err = capsys.readouterr().err
    assert rc == 1 and "GOLDEN FILES UNREADABLE" in err and "Permission denied" in err, err
    assert "create them" not in err
