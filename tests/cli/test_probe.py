"""``detsample probe`` command line (detsample/cli/probe.py): exit codes, JSON contract.

Pins: a failing probe exiting 0 (a CI gate that never fails), a usage error (unknown
model, a factory whose import fails, an unavailable device) giving a traceback or
exit 1 instead of 2 with the cause in the message, and the JSON keys or check names
drifting from docs/probe.md.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

from detsample.cli import main

MODEL_KEYS = {"ok", "platform", "target", "checks"}
CHECK_KEYS = {"name", "ok", "detail", "first_divergence"}
DIVERGENCE_KEYS = {"module", "op", "shapes", "max_ulp"}
OP_KEYS = {"op", "dtype", "batch_invariant", "run_to_run", "threads", "first_differing_sizes", "max_ulp"}
CHECKS = ["batch_invariance", "prefill_decode", "chunked_prefill", "run_to_run", "threads"]


@pytest.fixture(scope="module")
def platform():
    from detsample.golden.fingerprint import platform_fingerprint

    return platform_fingerprint("cpu")


def test_refmodel_passes_with_json(tmp_path, capsys, platform):
    path = tmp_path / "out" / "probe.json"
    assert main(["probe", "model", "refmodel", "--json", str(path)]) == 0
    assert "ok: every check holds bitwise" in capsys.readouterr().out
    data = json.loads(path.read_text())
    assert set(data) == MODEL_KEYS and data["ok"] is True
    assert data["platform"] == platform and data["target"] == "refmodel"
    assert [c["name"] for c in data["checks"]] == CHECKS
    assert all(set(c) == CHECK_KEYS and c["ok"] and c["first_divergence"] is None for c in data["checks"])


def test_refmodel_float_fails_with_exit_1(tmp_path, capsys):
    path = tmp_path / "probe.json"
    assert main(["probe", "model", "refmodel-float", "--json", str(path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "first divergence: refmodel-float -> aten::" in out
    data = json.loads(path.read_text())
    assert data["ok"] is False
    failed = [c for c in data["checks"] if not c["ok"]]
    assert "prefill_decode" in {c["name"] for c in failed}
    for c in failed:
        fd = c["first_divergence"]
        assert set(fd) == DIVERGENCE_KEYS and fd["op"].startswith("aten::")
        assert isinstance(fd["max_ulp"], int) and fd["max_ulp"] >= 1 and " vs " in fd["shapes"]


@pytest.fixture
def factories(tmp_path, monkeypatch):
    (tmp_path / "probe_factories.py").write_text(
        textwrap.dedent("""
        import os

        from detsample.refmodel import RefModel

        def ref():
            return RefModel()

        def fails():
            raise OSError("no checkpoint at /models/x")

        def needs(path):
            return RefModel()

        class Chatty:
            vocab_size = 512

            def new_cache(self):
                return []

            def forward(self, caches, chunks):
                return "logits, honest"

        def chatty():
            return Chatty()

        def marks():
            open(os.environ["PROBE_MARK"], "w").close()
            return RefModel()
    """)
    )
    (tmp_path / "probe_broken.py").write_text("import no_such_package_for_probe\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("probe_factories", "probe_broken"):
        sys.modules.pop(name, None)


def test_user_factory(factories, capsys):
    assert main(["probe", "model", "probe_factories:ref", "--json", "-"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["target"] == "probe_factories:ref" and data["ok"] is True
    assert "detsample probe model probe_factories:ref" in captured.err  # the table


USAGE = [
    (["model", "no-such-model"], "unknown model 'no-such-model'"),
    (
        ["model", "probe_broken:make"],
        "cannot import 'probe_broken' for model 'probe_broken:make': ModuleNotFoundError: "
        "No module named 'no_such_package_for_probe'",
    ),
    (["model", "probe_factories:nothing"], "has no callable 'nothing'"),
    # Bugs pinned: these were the factory's traceback and exit 1
    (
        ["model", "probe_factories:fails"],
        "model 'probe_factories:fails': fails() raised OSError: no checkpoint at /models/x",
    ),
    (
        ["model", "probe_factories:needs"],
        "model 'probe_factories:needs': the factory must be callable without arguments",
    ),
    (["model", "probe_factories:chatty"], "model 'probe_factories:chatty': forward returned a str"),
]


@pytest.mark.parametrize("args,message", USAGE, ids=[a[1] for a, _ in USAGE])
def test_usage_errors_exit_2(factories, capsys, args, message):
    assert main(["probe", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_json_path_is_checked_before_the_model_is_built(factories, tmp_path, monkeypatch, capsys):
    """Bug pinned: an unwritable --json failed only after the whole run."""
    mark = tmp_path / "built"
    monkeypatch.setenv("PROBE_MARK", str(mark))
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["probe", "model", "probe_factories:marks", "--json", str(blocker / "x.json")]) == 2
    assert "cannot write --json" in capsys.readouterr().err and not mark.exists()


def test_batch_invariant_flag_runs_under_the_mode(capsys):
    """mm is variant on this CPU (below) but holds under the mode; refmodel holds too."""
    assert main(["probe", "ops", "--op", "mm", "--batch-invariant"]) == 0
    assert main(["probe", "model", "refmodel", "--batch-invariant"]) == 0
    assert "ok: every check holds bitwise" in capsys.readouterr().out


def test_ops_subset_json_and_exit_1(tmp_path, capsys, platform):
    """mm is variant on this CPU, so the command fails (exit 1); log_softmax holds."""
    path = tmp_path / "ops.json"
    assert main(["probe", "ops", "--op", "mm,log_softmax", "--json", str(path)]) == 1
    out = capsys.readouterr().out
    assert "variant: mm (float32)" in out
    data = json.loads(path.read_text())
    assert set(data) == {"ok", "platform", "ops"} and data["ok"] is False
    assert data["platform"] == platform
    by_op = {r["op"]: r for r in data["ops"]}
    assert all(set(r) == OP_KEYS for r in data["ops"])
    assert by_op["mm"]["batch_invariant"] is False and by_op["log_softmax"]["batch_invariant"]


def test_ops_that_hold_exit_0(capsys):
    assert main(["probe", "ops", "--op", "log_softmax", "--dtype", "float32", "--threads", "1"]) == 0
    assert "ok: every op holds bitwise" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--dtype", "float8"], ["--threads", "0"], ["--threads", "x"], ["--device", "tpu"]])
def test_bad_ops_arguments_are_argparse_errors(capsys, args):
    with pytest.raises(SystemExit) as info:
        main(["probe", "ops", *args])
    assert info.value.code == 2 and args[0] in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the no-CUDA message")
def test_cuda_without_cuda_exit_2(capsys):
    assert main(["probe", "ops", "--device", "cuda", "--op", "mm"]) == 2
    assert "no CUDA" in capsys.readouterr().err


def test_unknown_op_and_missing_kind(capsys):
    assert main(["probe", "ops", "--op", "conv9d"]) == 2
    assert "unknown op 'conv9d'" in capsys.readouterr().err
    assert main(["probe"]) == 2


def test_unwritable_json_exit_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["probe", "ops", "--op", "log_softmax", "--threads", "1", "--json", str(blocker / "x.json")]) == 2
    assert "cannot write --json" in capsys.readouterr().err


def test_portable_needs_the_mode_and_lists_its_kernels(tmp_path, capsys):
    """--portable: the probe passes on the tiny Qwen2, its JSON names each kernel
    and what it rests on (products and sums: detsample's arithmetic); the verified mode
    names what it checked on this machine; --portable alone is a usage error."""
    assert main(["probe", "model", "hf-tiny-llama", "--portable"]) == 2
    assert "give --batch-invariant too" in capsys.readouterr().err
    for flags, mm_rests_on in ((["--portable"], "detsample's arithmetic"), ([], "verified on this machine")):
        path = tmp_path / f"p{len(flags)}.json"
        assert main(["probe", "model", "hf-tiny-qwen2", "--batch-invariant", *flags, "--json", str(path)]) == 0
        doc = json.loads(path.read_text())
        mms = [k for k in doc["kernels"] if k["op"] == "mm"]
        assert mms and all(k["rests_on"] == mm_rests_on for k in mms), mms
        assert set(doc["kernels"][0]) == {"op", "shape", "threads", "kernel", "rests_on", "reason"}
        assert "kernels the mode took on this machine" in capsys.readouterr().out
    assert main(["probe", "model", "refmodel", "--json", str(path)]) == 0
    assert "kernels" not in json.loads(path.read_text())  # outside the mode: as before


def test_coverage_check_names_uncovered_ops_and_refused_layers(tmp_path, monkeypatch, capsys):
    """Under the mode the probe adds a `coverage` check: an op of the model the mode does
    not cover (erf) fails it by op, module and shape; a linear-attention layer fails it by
    name, before any forward; a covered model passes it."""
    (tmp_path / "cov_models.py").write_text(
        textwrap.dedent("""
        import torch
        from detsample.models import build_tiny

        class Erf(torch.nn.Module):
            def forward(self, x):
                return torch.erf(x)

        class FakeGatedDeltaNet(torch.nn.Module):
            def forward(self, x):
                return x

        def erf_llama():
            m = build_tiny("hf-tiny-llama")
            m.model.layers[0].mlp.act_fn = Erf()
            return m

        def hybrid():
            m = build_tiny("hf-tiny-llama")
            m.model.layers[1].mixer = FakeGatedDeltaNet()
            return m
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "r.json"
    try:
        assert main(["probe", "model", "cov_models:erf_llama", "--batch-invariant", "--json", str(path)]) == 1
        cov = {c["name"]: c for c in json.loads(path.read_text())["checks"]}["coverage"]
        assert not cov["ok"] and "aten::erf in model.layers.0.mlp.act_fn [1x40x688]" in cov["detail"]
        assert main(["probe", "model", "cov_models:hybrid", "--batch-invariant", "--json", str(path)]) == 1
        doc = json.loads(path.read_text())
        assert [c["name"] for c in doc["checks"]] == ["coverage"]
        assert "model.layers.1.mixer (FakeGatedDeltaNet)" in doc["checks"][0]["detail"]
        assert main(["probe", "model", "hf-tiny-qwen2", "--batch-invariant", "--json", str(path)]) == 0
        cov = {c["name"]: c for c in json.loads(path.read_text())["checks"]}["coverage"]
        assert cov["ok"]
    finally:
        sys.modules.pop("cov_models", None)
    capsys.readouterr()


def test_threads_sets_the_run_and_the_threads_check_compares_1_and_n(capsys):
    """The bug: probe model had no --threads (rollout and audit had); OMP_NUM_THREADS was
    the only way, undocumented. --threads 3 runs every check at 3 threads and the threads
    check compares 1 and 3."""
    before = torch.get_num_threads()
    try:
        rc = main(["probe", "model", "refmodel", "--threads", "3"])
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr().out
    assert rc == 0 and "1 vs 3 threads" in out, out
