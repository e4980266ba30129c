"""Constrained random walks on the default model's tokenizer: whatever the (random) logits, the
masked samples spell text that parses and validates (JSON schema), matches (regex) or parses
(EBNF). Bounded grammars only, so every walk terminates within the step limit."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest

from radixrt.constrained import GrammarCompilerService, GrammarKind, GrammarSpec
from tests.constrained.conftest import random_walk

SEEDS = range(4)

SCHEMAS: dict[str, dict[str, Any]] = {
    "object_required": {
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 10},
                       "ok": {"type": "boolean"}, "note": {"type": "null"}},
        "required": ["name", "ok", "note"],
    },
    "enums": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"const": "XL"},
                       "level": {"enum": [1, 2, None]}},
        "required": ["color", "size", "level"],
    },
    "array_of_ints_bounded": {
        "type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 300},
        "minItems": 1, "maxItems": 4,
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {"type": "object",
                     "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999},
                                    "tags": {"type": "array", "maxItems": 2,
                                             "items": {"type": "string", "maxLength": 5}}},
                     "required": ["id", "tags"]},
            "scores": {"type": "array", "maxItems": 3,
                       "items": {"type": "number", "minimum": 0, "maximum": 1}},
        },
        "required": ["user", "scores"],
    },
    "refs_and_anyof": {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0,
                                                                    "maximum": 99}},
                            "required": ["x"]}},
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/point"},
                       "v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                       {"type": "string", "maxLength": 3}]}},
        "required": ["p", "v"],
    },
    "pattern_and_format": {
        "type": "object",
        "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                       "day": {"type": "string", "format": "date"}},
        "required": ["zip", "day"],
    },
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_walks_validate(service: GrammarCompilerService, tokenizer: Any, name: str) -> None:
    schema = SCHEMAS[name]
    spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema))
    for seed in SEEDS:
        walk = random_walk(service, tokenizer, spec, seed)
        value = json.loads(walk.text)
        jsonschema.validate(value, schema)
        assert "\n" not in walk.text  # single-line layout: no whitespace choices to loop on


def test_json_object_walk_is_an_object(service: GrammarCompilerService, tokenizer: Any) -> None:
    # json_object is unbounded; favour closing tokens so that random walks end
    closers = {i: 6.0 for i in range(service.vocab_size)
               if (s := tokenizer.decode([i])) and set(s) <= set('"}]')}
    assert closers
    spec = GrammarSpec(GrammarKind.JSON_OBJECT)
    for seed in SEEDS:
        walk = random_walk(service, tokenizer, spec, seed, bias=closers)
        assert isinstance(json.loads(walk.text), dict), walk.text


REGEXES = [
    r"[a-z]{1,8}@[a-z]{2,6}\.(com|org|net)",
    r"(\+1 )?\(\d{3}\) \d{3}-\d{4}",
    r"(yes|no|maybe)",
    r"[A-Z][a-z]{0,5}( [A-Z][a-z]{0,5}){0,2}\.",
    r"a.{1,4}z",
]


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_walks_fullmatch(service: GrammarCompilerService, tokenizer: Any, pattern: str) -> None:
    spec = GrammarSpec(GrammarKind.REGEX, pattern)
    for seed in SEEDS:
        walk = random_walk(service, tokenizer, spec, seed)
        assert re.fullmatch(pattern, walk.text), walk.text


NESTED_LISTS = r"""
root ::= "[" (inner ("," inner){0,2})? "]"
inner ::= "[" (num ("," num){0,2})? "]"
num ::= "0" | [1-9] [0-9]{0,2}
"""

ASSIGNMENTS = r"""
root ::= stmt ("; " stmt){0,2}
stmt ::= "let " name " = " value
name ::= [a-z] [a-z0-9_]{0,5}
value ::= [0-9]{1,3} | "\"" [a-z ]{0,6} "\""
"""
ASSIGNMENT_RE = re.compile(r'let [a-z][a-z0-9_]{0,5} = ([0-9]{1,3}|"[a-z ]{0,6}")')


def test_ebnf_nested_lists_parse(service: GrammarCompilerService, tokenizer: Any) -> None:
    spec = GrammarSpec(GrammarKind.EBNF, NESTED_LISTS)
    for seed in SEEDS:
        walk = random_walk(service, tokenizer, spec, seed)
        value = json.loads(walk.text)
        assert isinstance(value, list) and len(value) <= 3
        for inner in value:
            assert isinstance(inner, list) and len(inner) <= 3
            assert all(isinstance(n, int) and 0 <= n <= 999 for n in inner)


def test_ebnf_statements_parse(service: GrammarCompilerService, tokenizer: Any) -> None:
    spec = GrammarSpec(GrammarKind.EBNF, ASSIGNMENTS)
    for seed in SEEDS:
        walk = random_walk(service, tokenizer, spec, seed)
        stmts = walk.text.split("; ")
        assert 1 <= len(stmts) <= 3
        assert all(ASSIGNMENT_RE.fullmatch(s) for s in stmts), walk.text


def test_structural_tag_forces_a_tool_call(service: GrammarCompilerService, tokenizer: Any) -> None:
    args = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                             "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"]}
    tag = {"type": "structural_tag",
           "format": {"type": "tag", "begin": "<tool_call>{\"name\": \"weather\", \"arguments\": ",
                      "content": {"type": "json_schema", "json_schema": args}, "end": "}</tool_call>"}}
    spec = GrammarSpec(GrammarKind.STRUCTURAL_TAG, json.dumps(tag))
    for seed in SEEDS:
        walk = random_walk(service, tokenizer, spec, seed)
        m = re.fullmatch(r"<tool_call>(.*)</tool_call>", walk.text, re.S)
        assert m, walk.text
        call = json.loads(m.group(1))
        assert call["name"] == "weather"
        jsonschema.validate(call["arguments"], args)
