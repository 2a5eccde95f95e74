"""detsample/audit/running/text.py and the rollout's :class:`Ending`.

Bugs pinned: no stop strings; a stop string found in the prompt would have cut a
response; contradictory end options (--ignore-eos with --eos-token-id) were not refused.
"""

from __future__ import annotations

import pytest

from detsample.audit.running.rollout import Ending
from detsample.audit.running.text import load_text_tokenizer, stop_string_cut
from detsample.errors import InvalidSamplingParams
from tests.cli.chat_model import save_chat_model


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_text_tokenizer(str(save_chat_model(tmp_path_factory.mktemp("m") / "m")))


def test_stop_string_keeps_the_completing_token_and_nothing_after(tok):
    ids = tok.encode("hello the cat is good")
    assert stop_string_cut(tok, ids, ("cat",)) == 3
    assert stop_string_cut(tok, ids, ("dog",)) == len(ids)
    assert stop_string_cut(tok, ids, ()) == len(ids)


def test_stop_string_may_name_a_special_token(tok):
    ids = tok.encode("yes <|im_end|> no")
    assert stop_string_cut(tok, ids, ("<|im_end|>",)) == 2


def test_chat_render_uses_the_tokenizers_template(tok):
    text = tok.render_chat([{"role": "user", "content": "hello"}], "f:1")
    assert text.startswith("<|im_start|> user hello <|im_end|>") and text.endswith("assistant ")


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "user"}], [{"role": 1, "content": ""}]])
def test_bad_messages_name_the_row(tok, messages):
    with pytest.raises(InvalidSamplingParams, match="f:3: messages"):
        tok.render_chat(messages, "f:3")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(ignore_eos=True, eos_token_ids=(2,)), "contradict"),
        (dict(stop=("x",)), "need a tokenizer"),
        (dict(stop=("",), tokenizer="t.json"), "non-empty"),
        (dict(eos_token_ids=(-1,)), "stop_token_ids"),
        (dict(ignore_eos=1), "ignore_eos must be a bool"),
    ],
)
def test_ending_refuses_bad_input_by_name(kwargs, message):
    with pytest.raises(InvalidSamplingParams, match=message):
        Ending(**kwargs)


def test_ending_resolves_the_engines_eos():
    from types import SimpleNamespace

    ref = SimpleNamespace(vocab_size=512)  # no eos of its own: the reference model's 0
    assert Ending().engine_eos(ref) == (0,)
    chat = SimpleNamespace(vocab_size=16, eos_token_ids=(2, 5))
    assert Ending().engine_eos(chat) == (2, 5)
    assert Ending(eos_token_ids=(7,)).engine_eos(chat) == (7,)
    assert Ending(ignore_eos=True).engine_eos(chat) == ()
    with pytest.raises(InvalidSamplingParams, match="outside the model's vocabulary of 16"):
        Ending(eos_token_ids=(16,)).engine_eos(chat)
