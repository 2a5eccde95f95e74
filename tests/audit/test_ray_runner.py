"""--ray: the shards as Ray tasks on a local Ray with 2 CPUs give the one-process report
byte for byte; without Ray the flag says how to get it (detsample/audit/running/ray_runner.py)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from detsample.audit import AuditInputError, audit, to_json
from detsample.audit.running.ray_runner import INSTALL_HINT, RayUnavailable, ray_session
from detsample.cli import main
from tests.audit.synth import padded_twin, synth_rollouts, write_columns, write_jsonl, write_npz, write_parquet

DATA = Path(__file__).resolve().parents[1] / "data" / "audit_presets"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ray")
    cols = synth_rollouts(90, seed=21, mismatch_rate=0.5)
    out = [str(d / "r.jsonl"), str(d / "r.npz"), str(d / "r.parquet"), str(d / "p.npz")]
    write_jsonl(cols, out[0])
    write_npz(cols, out[1])
    write_parquet(cols, out[2], row_group_size=16)
    write_columns(padded_twin(cols, "default"), out[3])
    bad = d / "bad.jsonl"
    lines = open(out[0]).read().splitlines()
    lines[40] = "{not json"
    bad.write_text("\n".join(lines) + "\n")
    return out, str(bad)


def test_ray_report_is_byte_equal_to_one_process(local_ray, files):
    """Pins exact merging across Ray tasks: ragged and padded files, 5 shards each."""
    paths, _ = files
    one = to_json(audit(paths))
    assert to_json(audit(paths, ray=True, workers=5)) == one
    verl = str(DATA / "verl.parquet")
    assert to_json(audit(verl, preset="verl", ray="local")) == to_json(audit(verl, preset="verl"))


def test_ray_task_errors_come_back_as_themselves(local_ray, files, capsys):
    """Pins errors raised inside a task (--strict on a bad line): an AuditInputError,
    exit 2 from the CLI, the line named."""
    _, bad = files
    with pytest.raises(AuditInputError, match="line 41: <line>: invalid JSON"):
        audit(bad, ray=True, workers=2, strict=True)
    assert main(["audit", bad, "--ray", "--strict", "--quiet"]) == 2
    assert "invalid JSON" in capsys.readouterr().err
    assert main(["audit", bad, "--ray", "--json", "-", "--quiet"]) == 0


def test_without_ray_the_flag_says_how_to_get_it(monkeypatch, files, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    paths, _ = files
    with pytest.raises(RayUnavailable, match=INSTALL_HINT.replace("[", r"\[").replace("]", r"\]")):
        audit(paths[1], ray=True)
    assert main(["audit", paths[1], "--ray", "--quiet"]) == 2
    assert "pip install 'detsample[ray]'" in capsys.readouterr().err


def test_session_shuts_down_only_what_it_started(monkeypatch):
    """Pins ray_session: it starts (and then stops) a local Ray or connects to an address
    only when this process has none; an existing connection is reused and left open."""
    calls = []
    fake = types.SimpleNamespace(
        is_initialized=lambda: bool(calls and calls[-1][0] == "init"),
        init=lambda **kw: calls.append(("init", kw.get("address"))),
        shutdown=lambda: calls.append(("shutdown", None)),
    )
    monkeypatch.setitem(sys.modules, "ray", fake)
    with ray_session("local"), ray_session("ray://head:10001"):  # already connected: reused
        pass
    assert calls == [("init", None), ("shutdown", None)]
    calls.clear()
    with ray_session("ray://head:10001"):
        pass
    assert calls == [("init", "ray://head:10001"), ("shutdown", None)]
