"""Processors loaded as vLLM and SGLang load them, with per-request arguments.

Bugs pinned: processors only accepted as instances (a user porting a vLLM deployment
names them by class or entry point); a name that does not resolve, a class that is not
a processor or a constructor that fails reaching the first sample instead of a named
error; per-request arguments (vLLM ``extra_args``, SGLang ``custom_params``) not reaching
the processor, or a bad one accepted until the processor meets it mid-batch.
"""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap

import pytest
import torch

from detsample import InvalidSamplingParams, Request, Sampler, SamplingBatch, SamplingParams
from detsample.processors import loading
from detsample.refmodel import RefModel
from detsample.refmodel.engine import Engine, EngineConfig
from detsample.refmodel.schedule import Schedule

PLUGIN = textwrap.dedent('''
    import torch
    from detsample.processors.base import SlotProcessor

    class Boost(SlotProcessor):
        """Adds extra_args["boost"] to the logit of extra_args["token"] (rows without: none)."""

        def validate_params(self, params):
            args = params.extra_args or {}
            if "token" in args and (not isinstance(args["token"], int) or args["token"] < 0):
                raise ValueError(f"extra_args['token'] must be a token id, got {args['token']!r}")

        def is_argmax_invariant(self):
            return False

        def make_entry(self, added):
            args = added.params.extra_args or {}
            return (args["token"], float(args.get("boost", 100.0))) if "token" in args else None

        def apply(self, logits):
            for i, e in enumerate(self.slots):
                if e is not None:
                    logits[i, e[0]] += e[1]
            return logits

    class NeedsArgs(Boost):
        def __init__(self, config):
            super().__init__()

    class NotAProcessor:
        pass
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "ds_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield sys.modules.setdefault("ds_plugin", __import__("ds_plugin"))
    sys.modules.pop("ds_plugin", None)


@pytest.fixture
def entry_points(monkeypatch):
    eps = [
        importlib.metadata.EntryPoint("boost", "ds_plugin:Boost", loading.ENTRY_POINT_GROUP),
        importlib.metadata.EntryPoint("broken", "ds_plugin:Missing", loading.ENTRY_POINT_GROUP),
    ]
    real = importlib.metadata.entry_points

    def fake(**kw):
        if kw.get("group") == loading.ENTRY_POINT_GROUP:
            return [e for e in eps if e.name in fake.names]
        return real(**kw)

    fake.names = {"boost"}
    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    return fake


@pytest.mark.parametrize("spec", ["ds_plugin.Boost", "ds_plugin:Boost", "class", "boost"])
def test_a_processor_is_loaded_by_class_name_class_or_entry_point(plugin, entry_points, spec):
    sampler = Sampler(processors=(plugin.Boost if spec == "class" else spec,))
    assert type(sampler.processors[0]).__name__ == "Boost"
    assert [type(p).__name__ for p in loading.installed_processors()] == ["Boost"]


@pytest.mark.parametrize(
    "spec, match",
    [
        ("ds_plugin.Nope", "module 'ds_plugin' has no 'Nope'"),
        ("no_such_pkg_xyz.Boost", "cannot import 'no_such_pkg_xyz'"),
        ("ds_plugin:NotAProcessor", "is not a subclass of detsample.processors.LogitsProcessor"),
        ("ds_plugin.NeedsArgs", r"NeedsArgs\(\) raised TypeError"),
        ("nosuch", "no entry point of that name in the group 'detsample.logits_processors'"),
        ("broken", r"entry point 'broken' \(ds_plugin:Missing\): AttributeError"),
        (3, "expected a LogitsProcessor, a class, a class name or an entry-point name, got int"),
    ],
)
def test_a_bad_processor_spec_is_one_named_error(plugin, entry_points, spec, match):
    entry_points.names.add("broken")
    with pytest.raises(InvalidSamplingParams, match=match):
        Sampler(processors=(spec,))


def _engine_run(processors, requests):
    engine = Engine(
        RefModel(), Sampler(processors=processors), EngineConfig(default_max_new_tokens=4, eos_token_ids=())
    )
    return engine.run(Schedule.of([(0, r) for r in requests]))


def test_per_request_arguments_reach_the_processor(plugin):
    boosted = Request("b", SamplingParams(seed=1, extra_args={"token": 77}), [1, 2, 3])
    sglang = Request("s", SamplingParams(seed=2, extra_args={"token": 12, "boost": 1e4}), [4, 5])
    free = Request("f", SamplingParams(seed=3), [1, 2, 3])
    res = _engine_run(("ds_plugin.Boost",), [boosted, sglang, free])
    assert res["b"].token_ids == (77,) * 4 and res["s"].token_ids == (12,) * 4
    assert sglang.params.custom_params == {"token": 12, "boost": 1e4}
    alone = _engine_run(("ds_plugin.Boost",), [free])  # the free row is untouched
    assert alone["f"].token_ids == res["f"].token_ids
    assert torch.equal(alone["f"].logprobs["raw"].view(torch.int32), res["f"].logprobs["raw"].view(torch.int32))


def test_bad_per_request_arguments_are_refused_at_request_entry(plugin):
    bad = Request("x", SamplingParams(seed=1, extra_args={"token": "seventy"}), [1, 2])
    with pytest.raises(
        InvalidSamplingParams,
        match=r"request 'x' rejected by Boost: extra_args\['token'\] must be a "
        r"token id, got 'seventy'",
    ):
        _engine_run(("ds_plugin.Boost",), [Request("ok", SamplingParams(seed=0), [1]), bad])
    sampler = Sampler(processors=("ds_plugin.Boost",))
    with pytest.raises(InvalidSamplingParams, match="rejected by Boost"):
        sampler.validate_request(bad)
    batch = SamplingBatch.from_requests([bad], 512)
    with pytest.raises(InvalidSamplingParams, match="rejected by Boost"):
        sampler.sample(torch.zeros((1, 512)), batch, torch.tensor([1]))


@pytest.mark.parametrize(
    "value, match",
    [
        ([("token", 1)], "extra_args must be a mapping of str to values, got list"),
        ({1: 2}, "extra_args keys must be str, got 1"),
    ],
)
def test_extra_args_must_be_a_mapping_with_str_keys(value, match):
    with pytest.raises(InvalidSamplingParams, match=match):
        SamplingParams(extra_args=value)


def test_extra_args_are_copied_and_round_trip():
    args = {"token": 5}
    p = SamplingParams(seed=1, extra_args=args)
    args["token"] = 6
    assert p.extra_args == {"token": 5} and p.replace() == p
    assert p.to_dict()["extra_args"] == {"token": 5}
