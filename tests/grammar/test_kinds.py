"""Tests of detsample/grammar/kinds.py and config.py: kind dispatch and options."""

import json
import re

import pytest

from detsample import GrammarError, InvalidSamplingParams
from detsample.grammar import GrammarConfig
from detsample.grammar.kinds import check_kind, grammar_text

BAD_CONFIGS = [
    ({"compile_timeout_s": -1}, "compile_timeout_s must be None or a number >= 0, got -1"),
    ({"compile_timeout_s": float("nan")}, "compile_timeout_s must be None or a number >= 0"),
    ({"max_workers": 0}, "max_workers must be an integer >= 1, got 0"),
    ({"xgrammar_threads": 1.5}, "xgrammar_threads must be an integer >= 1, got 1.5"),
    ({"max_whitespace_cnt": 0}, "max_whitespace_cnt must be None or >= 1, got 0"),
    ({"mask_cache": 1}, "mask_cache must be a bool, got 1"),
    ({"verify_mask_cache": "yes"}, "verify_mask_cache must be a bool, got 'yes'"),
    ({"strict_mode": None}, "strict_mode must be a bool, got None"),
    ({"mask_cache_policy": "lazy"}, "mask_cache_policy must be one of ('recurring', 'eager'), got 'lazy'"),
    ({"cache_bytes": -1}, "cache_bytes must be an integer >= 0, got -1"),
    ({"cache_bytes": 1.5}, "cache_bytes must be an integer >= 0, got 1.5"),
    ({"cache_bytes": True}, "cache_bytes must be an integer >= 0, got True"),
]


@pytest.mark.parametrize("kind", ["yaml", "JSON_SCHEMA", ""])
def test_unknown_kind_is_a_clear_error(kind):
    with pytest.raises(GrammarError, match=f"grammar kind must be one of .* got {kind!r}"):
        check_kind(kind)


def test_dict_text_keeps_key_order():
    """Bug pinned: sort_keys=True reorders "properties" and so the emitted JSON order."""
    schema = {"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "integer"}}}
    assert list(json.loads(grammar_text("json_schema", schema))["properties"]) == ["z", "a"]


def test_non_str_regex_rejected():
    with pytest.raises(GrammarError, match="regex must be a str, got dict"):
        grammar_text("regex", {"a": 1})


@pytest.mark.parametrize("kwargs,msg", BAD_CONFIGS)
def test_bad_config(kwargs, msg):
    with pytest.raises(InvalidSamplingParams, match=re.escape(msg)):
        GrammarConfig(**kwargs)
