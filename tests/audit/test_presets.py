"""The preset example files (tests/data/audit_presets, written from each framework's own
batch layout) audit to the report of their ragged twin (detsample/audit/inputs/layout.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detsample.audit import AuditInputError, audit
from detsample.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "audit_presets"
PRESET_FILES = [("verl", "verl.parquet"), ("openrlhf", "openrlhf.pt"), ("trl", "trl.pt"), ("slime", "slime.pt")]
# ids each framework's batch gives: verl's uid (one per prompt group), row numbers
# (OpenRLHF's index, TRL has none), slime's sample_index
IDS = {
    "verl": [f"uid-{i // 4}" for i in range(8)],
    "openrlhf": [str(i) for i in range(8)],
    "trl": [str(i) for i in range(8)],
    "slime": [str(i) for i in range(8)],
}


def metrics_only(report: dict) -> dict:
    """The report without file names, locations and ids."""
    rep = dict(report)
    rep.pop("sources")
    rep["worst_sequences"] = [
        {k: v for k, v in w.items() if k not in ("source", "line", "row", "id")} for w in rep["worst_sequences"]
    ]
    for table in ("first_mismatches", "sequences_table"):
        rep[table] = [{k: v for k, v in w.items() if k != "id"} for w in rep[table]]
    return rep


@pytest.fixture(scope="module")
def twin():
    return audit(str(DATA / "rollouts.jsonl"))


@pytest.mark.parametrize("preset,name", PRESET_FILES)
def test_preset_example_audits_like_its_ragged_twin(twin, preset, name):
    """Pins each preset against the framework's layout: names, padding sides, where the
    prompt ends, masked tool tokens; the example file audits exactly like the JSONL twin."""
    rep = audit(str(DATA / name), preset=preset)
    assert metrics_only(rep) == metrics_only(twin)
    assert rep["tokens"] == 40 and rep["sequences"] == 8 and rep["excluded_sequences"] == 0
    worst = {w["row"]: w["id"] for w in rep["worst_sequences"]}
    assert all(IDS[preset][row] == rid for row, rid in worst.items())


def test_verl_parquet_with_columns_equals_preset():
    """Pins the issue's example: a verl-style Parquet audits with --preset verl and with
    an explicit --columns mapping (plus --padding) to the same report."""
    path = str(DATA / "verl.parquet")
    by_preset = audit(path, preset="verl")
    mapping = (
        "id=uid,prompt_ids=prompts,response_ids=responses,"
        "engine_logprobs=rollout_log_probs,trainer_logprobs=old_log_probs,"
        "mask=response_mask"
    )
    assert audit(path, columns=mapping) == by_preset
    with pytest.raises(AuditInputError, match="missing column 'id'"):
        audit(path)  # the audit's own names are not there


def test_cli_preset_and_bad_mapping(tmp_path, capsys):
    js = tmp_path / "a.json"
    assert main(["audit", str(DATA / "verl.parquet"), "--preset", "verl", "--json", str(js), "--quiet"]) == 0
    assert json.loads(js.read_text())["tokens"] == 40
    assert (
        main(
            [
                "audit",
                str(DATA / "verl.parquet"),
                "--preset",
                "verl",
                "--columns",
                "trainer_logprobs=actor_log_probs",
                "--quiet",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "verl.parquet: column 'actor_log_probs' (trainer_logprobs, preset verl, --columns) not found" in err
    assert main(["audit", str(DATA / "trl.pt"), "--columns", "engine=x", "--quiet"]) == 2
    assert "unknown column 'engine'" in capsys.readouterr().err
