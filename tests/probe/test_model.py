"""Model probe (detsample/probe/model.py): the five checks and their controls.

Pins: a check that cannot fail (each is shown failing on a model with exactly that
fault, and only that check), the positive control (the int64 refmodel) failing, the
negative controls (refmodel-float, the tiny Llama on float kernels) passing, and the
localisation naming something other than the first op that differs.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.models import ModelError, RefModelLM, load_model
from detsample.probe.model import CHECK_NAMES, ProbeConfig, _split, probe_model
from detsample.probe.threads import torch_threads

SMALL = ProbeConfig(prompt_len=12, neighbours=(3, 17, 6), chunks=(3, 4))
UNLOCALISED = ProbeConfig(prompt_len=12, neighbours=(3, 17, 6), chunks=(3, 4), localize=False)
EPS = 2.0**-10


class Faulty:
    """The int64 refmodel plus a known fault: ``EPS`` (else 0) added to a row's logits when the
    batch has several rows ("batch"), when a row decodes one token after a cache
    ("decode"), when it prefills several tokens after a cache ("chunk"), or when torch
    runs on one thread ("threads")."""

    def __init__(self, fault: str | None):
        self.inner, self.fault = RefModelLM(), fault
        self.name, self.vocab_size, self.max_seq_len = "faulty", 512, 1024

    def new_cache(self):
        return self.inner.new_cache()

    def forward(self, caches, chunks):
        past = [len(c) for c in caches]
        outs = self.inner.forward(caches, chunks)
        hit = {
            "batch": lambda p, n: len(chunks) > 1,
            "decode": lambda p, n: n == 1 and p > 0,
            "chunk": lambda p, n: n > 1 and p > 0,
            "threads": lambda p, n: torch.get_num_threads() == 1,
            None: lambda p, n: False,
        }[self.fault]
        # the add runs on every row (as a kernel would), its result depends on the fault
        return [o + (EPS if hit(p, len(c)) else 0.0) for o, p, c in zip(outs, past, chunks)]


def _failing(report):
    return {c.name for c in report.checks if not c.ok}


FAULTS = [
    (None, set()),
    ("batch", {"batch_invariance"}),
    ("decode", {"prefill_decode"}),
    ("chunk", {"chunked_prefill"}),
    ("threads", {"threads"}),
]


@pytest.mark.parametrize("fault,failing", FAULTS)
def test_each_check_catches_its_fault_and_only_it(fault, failing):
    with torch_threads(2):
        report = probe_model(Faulty(fault), UNLOCALISED, platform="p")
    assert [c.name for c in report.checks] == list(CHECK_NAMES)
    assert _failing(report) == failing and report.ok is (not failing)
    assert all(c.detail for c in report.checks)


def test_fault_outside_modules_is_localised_at_the_root():
    """The decode fault is the model's last op (an add on the logits); the model has no
    nn.Module, so the op is attributed to the model's name."""
    (check,) = probe_model(Faulty("decode"), SMALL, checks=["prefill_decode"]).checks
    assert not check.ok and "positions" in check.detail
    fd = check.first_divergence
    assert fd is not None and (fd.module, fd.op) == ("faulty", "aten::add")
    assert fd.shapes == "[1,512] vs [12,512]" and fd.max_ulp >= 1


def _expected(fault, cfg):
    spans = _split(cfg.prompt_len, cfg.chunks)
    later = [e - s for s, e in spans[1:]]
    return {
        None: set(),
        "batch": {"batch_invariance"},
        "decode": {"prefill_decode"} | ({"chunked_prefill"} if 1 in later else set()),
        "chunk": {"chunked_prefill"} if any(n > 1 for n in later) else set(),
    }[fault]


@settings(max_examples=8)
@given(
    fault=st.sampled_from([None, "batch", "decode", "chunk"]),
    prompt_len=st.integers(2, 10),
    neighbours=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    chunks=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    seed=st.integers(0, 2**31),
)
def test_fault_detection_over_configs(fault, prompt_len, neighbours, chunks, seed):
    cfg = ProbeConfig(
        prompt_len=prompt_len, neighbours=tuple(neighbours), chunks=tuple(chunks), seed=seed, localize=False
    )
    report = probe_model(Faulty(fault), cfg, checks=CHECK_NAMES[:3])
    assert _failing(report) == _expected(fault, cfg)


def test_positive_control_refmodel_passes():
    report = probe_model(load_model("refmodel"), SMALL, platform="p")
    assert report.ok and not _failing(report)
    assert all(c.first_divergence is None for c in report.checks)
    assert report.to_json()["target"] == "refmodel" and report.to_json()["platform"] == "p"


def test_negative_control_refmodel_float_fails_and_is_localised():
    """On this CPU F.linear rounds one row differently from 12 (tests/ops pin the op)."""
    report = probe_model(load_model("refmodel-float"), SMALL, checks=["prefill_decode"])
    (check,) = report.checks
    assert not check.ok and check.first_divergence is not None
    fd = check.first_divergence
    assert (fd.module, fd.op) == ("refmodel-float", "aten::mm")
    assert fd.shapes == "[1,64]x[64,64] vs [12,64]x[64,64]" and fd.max_ulp >= 1


@pytest.fixture(scope="module")
def llama():
    return load_model("hf-tiny-llama")


def test_tiny_llama_prefill_decode_names_q_proj_mm(llama):
    report = probe_model(llama, SMALL, checks=["prefill_decode"])
    (pd,) = report.checks
    assert not pd.ok and not report.ok
    fd = pd.first_divergence
    assert fd is not None
    assert (fd.module, fd.op) == ("model.layers.0.self_attn.q_proj", "aten::mm")
    assert fd.shapes == "[1,256]x[256,256] vs [12,256]x[256,256]"
    assert fd.describe().startswith(
        "first divergence: model.layers.0.self_attn.q_proj -> aten::mm [1,256]x[256,256] vs [12,256]x[256,256], "
    )


def test_config_and_model_errors():
    with pytest.raises(ValueError, match="prompt_len must be an int >= 2, got 1"):
        ProbeConfig(prompt_len=1)
    with pytest.raises(ValueError, match=r"chunks must be a non-empty tuple of ints >= 1, got \(0,\)"):
        ProbeConfig(chunks=(0,))
    with pytest.raises(ValueError, match=r"threads must be two ints >= 1, got \(1,\)"):
        ProbeConfig(threads=(1,))
    short = Faulty(None)
    short.max_seq_len = 10
    with pytest.raises(ModelError, match="max_seq_len=10 tokens; the probe needs 18"):
        probe_model(short, SMALL)
    with pytest.raises(ValueError, match="unknown check 'speed'"):
        probe_model(short, SMALL, checks=["speed"])
