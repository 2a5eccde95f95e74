"""Fuzzing the commands' options: hypothesis puts malformed values into the options of
``audit``, ``audit-log`` and ``rollout`` (numbers spelt oddly or out of range, empty
strings, special and missing paths, an output equal to an input) and every run must end
as the CLI promises (detsample/cli/__init__.py):

* an exit code in {0, 1, 2} -- 1 only for ``audit`` / ``audit-log`` (a gate), never for
  ``rollout``; nothing escapes ``main`` but argparse's usage exit (2);
* no "Traceback" on stderr; exit 2 with one ``detsample COMMAND: error:`` line (after
  argparse's usage lines);
* the inputs unchanged, byte for byte (an output equal to an input is refused, not
  written over it).

Bounded: a fixed set of examples in the default suite; ``DETSAMPLE_FUZZ_EXAMPLES=500``
for a longer, randomised run. tests/audit/test_fuzz.py fuzzes the audit's files.
"""

from __future__ import annotations

import hashlib
import json
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detsample.cli import main
from tests.cli.test_bad_input import GOOD, LOG_ROW

FUZZ_EXAMPLES = int(os.environ.get("DETSAMPLE_FUZZ_EXAMPLES", 40))
FUZZ_FIXED = "DETSAMPLE_FUZZ_EXAMPLES" not in os.environ

#: values that are malformed for some option: odd spellings, out of range, non-finite
NUMBERS = st.sampled_from(
    [
        "-1",
        "0",
        "1",
        "2",
        "1e400",
        "nan",
        "inf",
        "-inf",
        "1_2",
        " 3 ",
        "٣",
        "0x10",
        "",
        "1.5",
        "-0.0",
        "2_3",
        "99999999999999999999",
        "1e-400",
        "1,2",
        "abc",
        "--",
        "0.5",
        "3_1",
    ]
)
#: path-valued arguments: the inputs themselves, a directory, a missing path, /dev/null
PATH_VALUES = ("{rollout}", "{log}", "{dir}", "{missing}", "/dev/null", "{prompts}", "{out}", "-")
PATHS = st.sampled_from(PATH_VALUES)

#: command -> (its fixed arguments, its options and their value strategies)
COMMANDS = {
    "audit": (
        ["{rollout}", "--quiet"],
        {
            "--max-abs-diff": NUMBERS,
            "--min-exact-match": NUMBERS,
            "--max-excluded": NUMBERS,
            "--rollout-is-threshold": NUMBERS,
            "--rollout-rs-threshold": NUMBERS,
            "--workers": NUMBERS,
            "--threads": NUMBERS,
            "--json": PATHS,
            "--report": PATHS,
            "--temperature": NUMBERS,
            "--top-p": NUMBERS,
            "--top-k": NUMBERS,
        },
    ),
    "audit-log": (
        ["{log}", "--quiet"],
        {
            "--max-abs-diff": NUMBERS,
            "--min-exact-match": NUMBERS,
            "--max-k3": NUMBERS,
            "--max-mismatch": NUMBERS,
            "--max-excluded": NUMBERS,
            "--json": PATHS,
            "--report": PATHS,
        },
    ),
    "rollout": (
        ["{OUT}", "--max-new-tokens", "2"],
        {
            "--num-sequences": NUMBERS,
            "--seed": NUMBERS,
            "--temperature": NUMBERS,
            "--top-p": NUMBERS,
            "--top-k": NUMBERS,
            "--max-batch-size": NUMBERS,
            "--n": NUMBERS,
            "--stagger": NUMBERS,
            "--threads": NUMBERS,
            "--prompts": PATHS,
            "--max-new-tokens": NUMBERS,
        },
    ),
}
#: the commands a failed gate may end with exit 1
GATES = {"audit", "audit-log"}


def _files(root) -> dict[str, str]:
    paths = {
        "rollout": root / "r.jsonl",
        "log": root / "log.jsonl",
        "prompts": root / "p.jsonl",
        "dir": root / "a_dir",
        "missing": root / "missing.jsonl",
        "out": root / "out.jsonl",
    }
    paths["rollout"].write_text(json.dumps(GOOD) + "\n")
    paths["log"].write_text(json.dumps(LOG_ROW) + "\n")
    paths["prompts"].write_text(json.dumps({"prompt_ids": [5, 6, 7]}) + "\n")
    paths["dir"].mkdir(exist_ok=True)
    return {k: str(v) for k, v in paths.items()}


def _digest(paths: list[str]) -> dict[str, str]:
    return {p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths}


#: the harnesses' bounds (tests/cli/test_fuzz_commands.py runs under them too)
FUZZ_SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=FUZZ_FIXED,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def draw_command(draw, commands: dict) -> tuple[str, list[str], list[str], dict]:
    """One command of ``commands`` (name -> (fixed arguments, option strategies)) and 1 to
    3 of its options: ``(name, argv without the options, chosen options, strategies)``."""
    command = draw(st.sampled_from(sorted(commands)))
    fixed, options = commands[command]
    chosen = draw(st.lists(st.sampled_from(sorted(options)), min_size=1, max_size=3, unique=True))
    return command, [*command.split(), *fixed], chosen, options


@st.composite
def invocations(draw):
    command, argv, chosen, options = draw_command(draw, COMMANDS)
    if command == "rollout":  # OUT sometimes the prompts it reads
        argv[1] = draw(st.sampled_from(["{out}", "{prompts}"]))
        chosen = [*chosen, "--prompts"] if argv[1] == "{prompts}" and "--prompts" not in chosen else chosen
    for opt in chosen:
        value = "{prompts}" if opt == "--prompts" and argv[1] == "{prompts}" else draw(options[opt])
        argv += [opt, value]
    return argv


def _ends_as_promised(
    argv: list[str], files: dict[str, str], capsys, inputs: list[str] | None = None, gate: bool | None = None
) -> None:
    """One invocation checked against the promises of the module docstring. ``inputs``:
    the files that must not change (default the command's own inputs); ``gate``: whether
    exit 1 is allowed (default: ``argv[0]`` in GATES)."""
    argv = [a.format(**files) for a in argv]
    if inputs is None:
        given = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--prompts"]
        inputs = [{"audit": files["rollout"], "audit-log": files["log"]}.get(argv[0]), *given]
    inputs = [p for p in inputs if p is not None and os.path.isfile(p)]
    gate = argv[0] in GATES if gate is None else gate
    before = _digest(inputs)
    capsys.readouterr()
    try:
        rc = main(argv)  # anything else escaping is a failure
    except SystemExit as exc:  # argparse's usage error: exit 2
        rc = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, (argv, err)
    assert rc in ((0, 1, 2) if gate else (0, 2)), (argv, rc, err)
    if rc == 2:  # "detsample audit: error: ..." (or "detsample golden update: error: ...")
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("usage:", " "))]
        assert lines and lines[-1].startswith(f"detsample {argv[0]}") and ": error: " in lines[-1], (argv, err)
    assert _digest(inputs) == before, argv


def test_the_harness_catches_an_output_written_over_its_input(tmp_path, capsys, monkeypatch):
    """Negative control: with rollout's output-equals-input refusal switched off (the old
    code), the harness's promise breaks on ``rollout p.jsonl --prompts p.jsonl``: the
    prompts file is replaced by the rollout."""
    import pytest

    from detsample.cli import rollout

    monkeypatch.setattr(rollout, "output_input_clash", lambda *a: None)
    with pytest.raises(AssertionError):
        _ends_as_promised(
            ["rollout", "{prompts}", "--max-new-tokens", "2", "--prompts", "{prompts}"], _files(tmp_path), capsys
        )


@FUZZ_SETTINGS
@given(argv=invocations())
def test_malformed_options_end_as_promised(tmp_path_factory, capsys, argv):
    _ends_as_promised(argv, _files(tmp_path_factory.mktemp("fuzz")), capsys)
