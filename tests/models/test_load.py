"""load_model: the names, user factories, and errors that name what went wrong.

Pins: an unknown name or a factory that fails to import giving a bare traceback (or,
worse, silently falling back to another model).
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from detsample.models import MODEL_NAMES, HFCausalLM, ModelError, RefModelFloat, RefModelLM, load_model, prefill

KINDS = [
    ("refmodel", RefModelLM),
    ("refmodel-float", RefModelFloat),
    ("hf-tiny-llama", HFCausalLM),
    ("hf-tiny-qwen2", HFCausalLM),
]


@pytest.mark.parametrize("spec,cls", KINDS)
def test_builtin_names(spec, cls):
    m = load_model(spec)
    assert isinstance(m, cls) and m.name == spec and m.vocab_size == 512
    assert prefill(m, [1, 2, 3]).shape == (3, 512)
    assert spec in MODEL_NAMES


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "usermodels.py").write_text(
        textwrap.dedent("""
        from detsample.models import build_tiny
        from detsample.refmodel import RefModel

        class Mine:
            vocab_size = 512
            seen_mode = None
            def new_cache(self):
                return []
            def forward(self, caches, chunks):
                import torch
                from detsample.invariant import is_enabled
                Mine.seen_mode = is_enabled()
                out = []
                for c, ch in zip(caches, chunks):
                    c.extend(ch)
                    out.append(torch.zeros(len(ch), 512))
                return out

        def hf():
            return build_tiny("hf-tiny-qwen2", seed=1)

        def ref():
            return RefModel()

        def mine():
            return Mine()

        def junk():
            return 42

        def fails():
            raise RuntimeError("weights not found")

        def needs_args(path, dtype):
            return Mine()

        class Talker(Mine):
            def forward(self, caches, chunks):
                return "hello"

        def talker():
            return Talker()

        class Short(Mine):
            def forward(self, caches, chunks):
                import torch
                return [torch.zeros(1, 7) for _ in chunks]

        def short():
            return Short()

        import torch

        class StringHF(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.config = type("Config", (), {"vocab_size": 512})()
                self.lin = torch.nn.Linear(2, 2)

            def forward(self, *args, **kwargs):
                return "a string"

        def string_hf():
            return StringHF()
    """)
    )
    (tmp_path / "brokenmodels.py").write_text("import no_such_package_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for m in ("usermodels", "brokenmodels"):
        sys.modules.pop(m, None)


FACTORIES = [("usermodels:hf", HFCausalLM), ("usermodels:ref", RefModelLM)]


@pytest.mark.parametrize("spec,cls", FACTORIES)
def test_factories_are_adapted(user_module, spec, cls):
    m = load_model(spec)
    assert isinstance(m, cls) and m.name == spec


def test_a_factory_returning_a_causal_lm_is_used_as_is(user_module):
    m = load_model("usermodels:mine")
    assert m.name == "usermodels:mine" and m.max_seq_len is None
    assert torch.equal(prefill(m, [1, 2]), torch.zeros(2, 512))


BAD_SPECS = [
    ("gpt-5", "unknown model 'gpt-5'"),
    ("", "non-empty string"),
    ("usermodels:", "package.module:factory"),
    ("brokenmodels:f", "cannot import 'brokenmodels'.*ModuleNotFoundError.*no_such_package_xyz"),
    ("usermodels:nope", "has no callable 'nope'"),
    ("usermodels:junk", "neither a Hugging Face causal LM nor a CausalLM"),
    # Bugs pinned: a factory that raises or needs arguments ended in the user's
    # traceback (exit 1) instead of one message naming module:factory (exit 2).
    ("usermodels:fails", r"'usermodels:fails': fails\(\) raised RuntimeError: weights not found"),
    (
        "usermodels:needs_args",
        r"'usermodels:needs_args': the factory must be callable without "
        r"arguments \(needs_args\(path, dtype\)",
    ),
]


@pytest.mark.parametrize("spec,message", BAD_SPECS)
def test_bad_specs_name_the_problem(user_module, spec, message):
    with pytest.raises(ModelError, match=message):
        load_model(spec)


INVARIANT_SPECS = ["refmodel", "refmodel-float", "hf-tiny-qwen2", "usermodels:hf", "usermodels:ref", "usermodels:mine"]


@pytest.mark.parametrize("spec", INVARIANT_SPECS)
def test_batch_invariant_runs_every_forward_under_the_mode(user_module, spec):
    from detsample.invariant import ATTENTION_NAME, is_enabled

    m = load_model(spec, batch_invariant=True)
    assert m.name == spec and m.vocab_size == 512 and m.batch_invariant
    assert prefill(m, [1, 2, 3]).shape == (3, 512) and not is_enabled()
    if isinstance(m, HFCausalLM):
        assert m.module.config._attn_implementation == ATTENTION_NAME
    if spec == "usermodels:mine":
        assert sys.modules["usermodels"].Mine.seen_mode is True
    assert not getattr(load_model(spec), "batch_invariant", False)


FORWARD_DEFECTS = [
    # (factory, text): a model whose forward answers outside the protocol is named at the
    # first forward (a forward returning a string crashed deep in the probe)
    ("usermodels:talker", r"'usermodels:talker': forward returned a str; expected a list of 1"),
    ("usermodels:short", r"forward returned a torch.float32 tensor of shape \[1, 7\] for row 0"),
    ("usermodels:string_hf", r"'usermodels:string_hf': forward raised AttributeError"),
]


@pytest.mark.parametrize("spec,message", FORWARD_DEFECTS)
def test_a_forward_outside_the_protocol_is_a_named_error(user_module, spec, message):
    m = load_model(spec)
    with pytest.raises(ModelError, match=message):
        prefill(m, [1, 2])


def test_checked_models_keep_their_adapter_class(user_module):
    from detsample.models import CheckedLM

    m = load_model("usermodels:hf")
    assert type(m) is CheckedLM and isinstance(m, HFCausalLM) and m.module is m.inner.module
