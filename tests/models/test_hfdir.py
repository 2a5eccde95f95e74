"""detsample/models/hfdir.py: a local Hugging Face directory as a model spec, and the end
tokens read as engines read them.

Bugs pinned: a model's ``eos_token_id`` (and the generation config's list) was never
read; ``--model DIR`` was not a model spec; a directory without config.json reached
transformers (a traceback) instead of one named error.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from detsample.models import ModelError, is_model_spec, load_model, model_eos_token_ids
from detsample.models.hfdir import check_model_dir, config_eos_token_ids, is_model_dir_spec


def _model(eos, gen_eos="absent"):
    gen = None if gen_eos == "absent" else SimpleNamespace(eos_token_id=gen_eos)
    return SimpleNamespace(config=SimpleNamespace(eos_token_id=eos), generation_config=gen)


@pytest.mark.parametrize(
    "eos,gen,expected",
    [
        (2, "absent", (2,)),
        ([2, 7], "absent", (2, 7)),
        (2, [2, 5], (2, 5)),
        (None, 3, (3,)),
        (None, None, ()),
        (7, 2, (2, 7)),
    ],
)
def test_eos_is_the_union_of_config_and_generation_config(eos, gen, expected):
    assert config_eos_token_ids(_model(eos, gen)) == expected


def test_not_a_hf_model_declares_no_eos():
    assert config_eos_token_ids(object()) is None


@pytest.mark.parametrize("bad", [-1, "2", [2, None], True])
def test_a_bad_eos_token_id_is_named(bad):
    with pytest.raises(ModelError, match="eos_token_id"):
        config_eos_token_ids(_model(bad))


def test_reference_and_tiny_models_keep_eos_zero():
    # the engine default (id 0) stays theirs: goldens and earlier rollouts do not move
    assert model_eos_token_ids(load_model("refmodel")) is None
    assert model_eos_token_ids(load_model("hf-tiny-llama")) is None


def test_directory_spec_syntax(tmp_path):
    assert is_model_dir_spec(str(tmp_path)) and is_model_spec(str(tmp_path))
    assert is_model_dir_spec("./models/x") and not is_model_dir_spec("pkg.mod:factory")
    assert not is_model_dir_spec("refmodel")


def test_check_model_dir_names_what_is_missing(tmp_path):
    with pytest.raises(ModelError, match="no such directory"):
        check_model_dir(str(tmp_path / "nope"))
    with pytest.raises(ModelError, match="no config.json"):
        check_model_dir(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="no weights"):
        check_model_dir(str(tmp_path))


def test_dtype_is_refused_for_a_built_model():
    with pytest.raises(ModelError, match="applies to a model directory"):
        load_model("refmodel", dtype="bfloat16")
    with pytest.raises(ModelError, match="dtype must be one of"):
        load_model(".", dtype="float64")


def test_tp_divisibility_is_refused_from_config_before_the_weights_load(tmp_path, monkeypatch):
    # the bug: --tp 2 on a 9-head model was refused only after a 73 s load
    import detsample.models
    from detsample.parallel import TensorParallelError, TPModelSpec, check_spec
    from tests.cli.chat_model import save_chat_model

    d = save_chat_model(tmp_path / "m")  # 4 heads, 2 key/value heads

    def no_load(*a, **k):
        raise AssertionError("the weights were loaded before the TP check")

    monkeypatch.setattr(detsample.models, "load_model", no_load)
    with pytest.raises(TensorParallelError, match="tp=3 does not divide config.num_attention_heads=4"):
        check_spec(TPModelSpec(str(d), 3))
    with pytest.raises(AssertionError, match="weights were loaded"):  # tp=2 passes to the load
        check_spec(TPModelSpec(str(d), 2))


def test_a_factory_hf_model_brings_its_config_eos(tmp_path, monkeypatch):
    (tmp_path / "chatfactory.py").write_text(
        "from tests.cli.chat_model import CONFIG\n"
        "from detsample.models.tiny import build_hf\n"
        "def make():\n    return build_hf('llama', 0, **CONFIG)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert model_eos_token_ids(load_model("chatfactory:make")) == (2,)
