"""Tests of detsample/cli/bench.py: ``detsample bench`` arguments and output."""

from __future__ import annotations

import json

import pytest

from detsample.cli import main

TINY = ["--batch", "1", "--vocab", "64", "--repeat", "1", "--config", "greedy", "--no-compile", "--min-seconds", "0"]


def test_tiny_run_prints_table_and_json(tmp_path, capsys):
    path = tmp_path / "rows.json"
    assert main(["bench", *TINY, "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| V | B | config | detsample ops | detsample |" in out and "| 64 | 1 | greedy |" in out
    rows = json.loads(path.read_text())
    assert {r["path"] for r in rows} >= {"detsample", "SGLang / vLLM greedy"}
    assert all(r["B"] == 1 and r["V"] == 64 and r["median_ms"] >= 0 and r["ops"] > 0 for r in rows)


def test_comma_separated_batches_and_peer_columns(tmp_path, capsys):
    """``--batch 1,2`` (the issue's spelling) and the peers' columns in one run."""
    path = tmp_path / "rows.json"
    assert (
        main(
            [
                "bench",
                "--batch",
                "1,2",
                "--vocab",
                "64",
                "--repeat",
                "1",
                "--config",
                "topp0.9_T0.8",
                "--no-compile",
                "--min-seconds",
                "0",
                "--json",
                str(path),
            ]
        )
        == 0
    )
    rows = json.loads(path.read_text())
    assert {r["B"] for r in rows} == {1, 2}
    assert {r["path"] for r in rows} >= {
        "detsample",
        "detsample sort",
        "SGLang deterministic (eager)",
        "SGLang shortcut",
        "vLLM seeded",
        "vLLM unseeded",
        "bare stable sort",
    }


# Bug pinned: these crashed with a traceback (StatisticsError, InvalidSamplingParams,
# RuntimeError), ran an empty batch, or silently ignored --threads 0.
BAD = [
    ["--repeat", "0"],
    ["--threads", "0"],
    ["--batch", "0"],
    ["--batch", "-1"],
    ["--batch", "1,x"],
    ["--vocab", "0"],
    ["--config", "bogus"],
    ["--logits", "uniform"],
    ["--min-seconds", "-1"],
    ["--min-seconds", "nan"],
]


@pytest.mark.parametrize("args", BAD, ids=[" ".join(a) for a in BAD])
def test_bad_arguments_are_usage_errors(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", *TINY, *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert args[0] in err and args[1] in err


def test_cuda_without_cuda_and_matmul_without_cuda_are_errors(capsys, monkeypatch):
    """--device cuda on a machine without CUDA, and --matmul on CPU, exit 2 with the reason
    (instead of a traceback from deep inside torch)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", *TINY, "--device", "cuda"]) == 2
    assert "--device cuda needs CUDA" in capsys.readouterr().err
    assert main(["bench", *TINY, "--matmul"]) == 2
    assert "--matmul needs --device cuda" in capsys.readouterr().err


def test_min_seconds_adds_rounds_to_short_cases():
    """A round shorter than ``min_seconds`` is repeated until about that much time is
    timed (capped at MAX_REPEAT), never fewer than ``repeat`` rounds; 0 keeps ``repeat``."""
    import time

    from detsample.benchmarks import sampler as bench

    calls = {"a": 0, "b": 0}

    def fn(k):
        def run():
            calls[k] += 1
            time.sleep(0.001)

        return run

    bench.round_robin_ms({k: fn(k) for k in calls}, 3, min_seconds=0.0)
    assert calls == {"a": 4, "b": 4}  # a warm-up call and 3 rounds
    calls.update(a=0, b=0)
    bench.round_robin_ms({k: fn(k) for k in calls}, 3, min_seconds=0.1)
    # ~0.1 s / ~2 ms a round (fewer when the machine stalls a sleep), + the warm-up
    assert 4 < calls["a"] == calls["b"] <= 1 + bench.MAX_REPEAT


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e400"])
def test_min_seconds_must_be_finite(capsys, value):
    """Bug pinned: --min-seconds inf ended in an OverflowError traceback."""
    with pytest.raises(SystemExit) as info:
        main(["bench", *TINY[:-2], "--min-seconds", value])
    assert info.value.code == 2 and "--min-seconds" in capsys.readouterr().err


def test_unwritable_json_is_refused_before_the_timings(tmp_path, capsys, monkeypatch):
    """Bug pinned: bench --json DIR/not-a-dir/x.json ran the whole benchmark
    and then failed writing."""
    from detsample.benchmarks import sampler

    monkeypatch.setattr(sampler, "run", lambda *a, **k: pytest.fail("timed before checking"))
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    assert main(["bench", *TINY, "--json", str(blocker / "x.json")]) == 2
    assert "cannot write --json" in capsys.readouterr().err
