"""``detsample audit`` command line: outputs, gates and exit codes
(detsample/commands/audit.py)."""

from __future__ import annotations

import json

import pytest

from detsample.cli import main
from tests.audit.synth import synth_rollouts, write_jsonl, write_npz


@pytest.fixture(scope="module")
def exact_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "exact.npz"
    write_npz(synth_rollouts(40, seed=1, mismatch_rate=0.0), str(path))
    return str(path)


@pytest.fixture(scope="module")
def noisy_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "noisy.jsonl"
    write_jsonl(synth_rollouts(40, seed=2, mismatch_rate=0.3), str(path))
    return str(path)


CASES = [
    # (file fixture, extra args, exit code, text on stderr)
    ("exact_file", [], 0, ""),
    ("exact_file", ["--max-abs-diff", "0", "--min-exact-match", "1"], 0, ""),
    ("noisy_file", [], 0, ""),
    ("noisy_file", ["--max-abs-diff", "0"], 1, "GATE FAILED: max_abs_diff = "),
    ("noisy_file", ["--min-exact-match", "0.99"], 1, "GATE FAILED: exact_match_fraction = "),
    ("noisy_file", ["--max-abs-diff", "10", "--min-exact-match", "0.1"], 0, ""),
]


@pytest.mark.parametrize("fixture,args,code,text", CASES)
def test_exit_codes_and_gates(request, capsys, fixture, args, code, text):
    path = request.getfixturevalue(fixture)
    assert main(["audit", path, *args]) == code
    out, err = capsys.readouterr()
    assert text in err
    assert "exact_match_fraction" in out and "mismatch |d| > 0.001" in out


def test_json_and_report_outputs(noisy_file, tmp_path, capsys):
    js = tmp_path / "r.json"
    assert main(["audit", noisy_file, "--json", str(js), "--report", str(tmp_path / "rep"), "--workers", "1"]) == 0
    capsys.readouterr()
    rep = json.loads(js.read_text())
    assert rep["sequences"] == 40 and 0 < rep["exact_match_fraction"] < 1
    for name in (
        "index.html",
        "abs_diff_histogram.png",
        "diff_by_position.png",
        "diff_by_probability.png",
        "report.json",
    ):
        assert (tmp_path / "rep" / name).stat().st_size > 0
    assert main(["audit", noisy_file, "--json", "-", "--quiet"]) == 0
    out, _ = capsys.readouterr()
    again = json.loads(out)
    for r in (again, rep):  # what made each report: its own command line and time
        r["provenance"].pop("command"), r["provenance"].pop("created")
    assert again == rep


def test_json_to_stdout_is_pure_json(noisy_file, capsys):
    assert main(["audit", noisy_file, "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["sequences"] == 40
    assert "exact_match_fraction" in err  # the table goes to stderr then


def test_strict_bad_input_exits_2_naming_line_and_field(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"id": "a", "prompt_ids": [1], "response_ids": [1], "engine_logprobs": [0.5], "trainer_logprobs": [-1.0]}\n'
    )
    assert main(["audit", str(path)]) == 1  # excluded and counted; nothing left to audit
    out, err = capsys.readouterr()
    assert "1 excluded" in out and f"{path}:line 1: engine_logprobs:" in out
    assert "no tokens audited: all 1 sequences were excluded (positive_logprob: 1)" in err
    assert main(["audit", str(path), "--strict"]) == 2
    _, err = capsys.readouterr()
    assert f"{path}:line 1: engine_logprobs:" in err
    assert main(["audit", str(path), "--min-exact-match", "0.5"]) == 1  # no tokens left
    _, err = capsys.readouterr()
    assert "exact_match_fraction: no tokens audited" in err


@pytest.mark.parametrize(
    "args", [["--workers", "0"], ["--min-exact-match", "1.5"], ["--max-abs-diff", "-1"], ["--rescore", "gpt2"]]
)
def test_bad_arguments_are_usage_errors(noisy_file, args):
    with pytest.raises(SystemExit) as info:
        main(["audit", noisy_file, *args])
    assert info.value.code == 2


def test_missing_file_exits_2(tmp_path, capsys):
    assert main(["audit", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_dtype_option(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text(
        json.dumps(
            {
                "id": "a",
                "prompt_ids": [1],
                "response_ids": [1],
                "engine_logprobs": [-0.1],
                "trainer_logprobs": [-0.10000000149011612],
            }
        )
        + "\n"
    )
    assert main(["audit", str(path), "--min-exact-match", "1"]) == 1
    assert main(["audit", str(path), "--min-exact-match", "1", "--dtype", "float32"]) == 0


def test_json_into_a_new_folder(exact_file, tmp_path, capsys):
    """Bug pinned: `--json out/a.json` with no `out/` crashed with a FileNotFoundError
    traceback and exit 1 - the exit status of a failed gate."""
    js = tmp_path / "new" / "deeper" / "a.json"
    assert main(["audit", exact_file, "--json", str(js), "--quiet"]) == 0
    assert json.loads(js.read_text())["sequences"] == 40


@pytest.mark.parametrize("flag", ["--json", "--report"])
def test_unwritable_output_exits_2(exact_file, tmp_path, capsys, flag):
    """Bug pinned: an output path that cannot be written (here: a directory for --json,
    a file for --report) crashed with a traceback and exit 1 - a failed gate's status."""
    target = tmp_path / "taken"
    target.mkdir() if flag == "--json" else target.write_text("x")
    assert main(["audit", exact_file, flag, str(target), "--quiet"]) == 2
    assert f"cannot write {flag} {target}" in capsys.readouterr().err


def test_outputs_are_checked_before_any_file_is_read(tmp_path, capsys, monkeypatch):
    """Bug pinned: an unwritable --json/--report was found after the audit."""
    import detsample.audit as audit_pkg

    monkeypatch.setattr(audit_pkg, "audit", lambda *a, **k: pytest.fail("audited first"))
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    for flag in ("--json", "--report"):
        assert main(["audit", str(tmp_path / "r.jsonl"), flag, str(blocker / "x")]) == 2
        assert f"cannot write {flag}" in capsys.readouterr().err


class _Tty:
    """A stream that says it is a terminal."""

    def __init__(self) -> None:
        import io

        self.buf = io.StringIO()

    def write(self, s: str) -> int:
        return self.buf.write(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_rescore_progress_on_a_terminal_only(tmp_path, capsys, monkeypatch):
    """On a terminal, `audit --rescore` draws progress on stderr; stdout (the --json
    report) is byte-equal to the run without a terminal, and off a terminal stderr holds
    no progress."""
    import json as _json
    import sys

    from detsample.audit.running.rollout import generate_rollouts

    path = tmp_path / "r.jsonl"
    path.write_text("".join(_json.dumps(r) + "\n" for r in generate_rollouts(num_sequences=3, max_new_tokens=4)))
    monkeypatch.delenv("CI", raising=False)
    args = ["audit", str(path), "--rescore", "refmodel", "--json", "-", "--quiet"]
    assert main(args) == 0
    plain = capsys.readouterr()
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(args) == 0
    drawn = capsys.readouterr()
    assert _strip_volatile(drawn.out) == _strip_volatile(plain.out)
    assert "sequences rescored" in tty.buf.getvalue() and "3/" in tty.buf.getvalue()
    assert "sequences rescored" not in plain.err


def _strip_volatile(text: str) -> str:
    """The JSON report without the platform's thread count and the report's time (the
    only fields a second run in one process may change)."""
    import json as _json

    rep = _json.loads(text)
    rep.get("provenance", {}).get("platform", {}).pop("threads", None)
    rep.get("provenance", {}).pop("created", None)
    return _json.dumps(rep, sort_keys=True)


def test_the_report_shows_each_mismatching_tokens_text_from_the_rescore_directory(tmp_path, capsys):
    """The bug: reports showed token ids only, with a tokenizer at hand. A model
    directory's tokenizer (--rescore DIR) names the text of each first mismatching token in
    report.json and the page; --tokenizer gives one explicitly; a bad one is exit 2 before
    any file is read."""
    from tests.cli.chat_model import WORDS, save_chat_model

    model = save_chat_model(tmp_path / "chat")
    rollout = tmp_path / "r.jsonl"
    assert (
        main(
            [
                "rollout",
                str(rollout),
                "--model",
                str(model),
                "--num-sequences",
                "3",
                "--max-new-tokens",
                "4",
                "--ignore-eos",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in rollout.read_text().splitlines()]
    rows[0]["engine_logprobs"][0] -= 0.5  # one certain mismatch
    rollout.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["audit", str(rollout), "--rescore", str(model), "--report", str(tmp_path / "rep"), "--quiet"]) in (
        0,
        1,
    )
    first = json.loads((tmp_path / "rep" / "report.json").read_text())["first_mismatches"][0]
    assert first["token"] == WORDS[first["token_id"]]
    assert "<th>token</th>" in (tmp_path / "rep" / "index.html").read_text()
    capsys.readouterr()
    assert main(["audit", str(rollout), "--tokenizer", str(tmp_path / "missing.json"), "--quiet"]) == 2
    assert "no such file" in capsys.readouterr().err
