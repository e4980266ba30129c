"""Grammar-constrained decoding end to end on the default model (offline Engine, CPU)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from radixrt.engine import Engine

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
PROMPT = "Describe a person as JSON with a name and an age:"


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    return Engine(model_path=str(model_dir), max_total_tokens=8192, device="cpu")


def test_json_schema_outputs_validate_at_temperature_one(engine: Engine) -> None:
    sp = {"temperature": 1.0, "max_new_tokens": 60, "json_schema": json.dumps(SCHEMA)}
    outs = engine.generate([PROMPT] * 10, [dict(sp, seed=i) for i in range(10)])
    for o in outs:
        assert o["meta_info"]["finish_reason"] == "stop", o
        jsonschema.validate(json.loads(o["text"]), SCHEMA)


def test_regex_output_fullmatches(engine: Engine) -> None:
    regex = r"(red|green|blue) [0-9]{2,3}"
    out = engine.generate("Name a colour and a number:",
                          {"temperature": 0.8, "seed": 3, "max_new_tokens": 20, "regex": regex})[0]
    assert out["meta_info"]["finish_reason"] == "stop"
    assert re.fullmatch(regex, out["text"]), out["text"]


def test_constrained_and_plain_requests_share_the_prefix_cache(engine: Engine) -> None:
    prompt = "The history of the printing press began in the fifteenth century, when " * 4
    plain = {"temperature": 0.0, "max_new_tokens": 8}
    first = engine.generate([prompt], plain)[0]
    outs = engine.generate([prompt, prompt], [dict(plain, ebnf='root ::= "yes" | "no"'), plain])
    assert outs[0]["text"] in ("yes", "no") and outs[0]["meta_info"]["finish_reason"] == "stop"
    assert outs[1]["output_ids"] == first["output_ids"]
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in outs)


def test_invalid_grammar_aborts_with_an_error_and_others_run(engine: Engine) -> None:
    outs = engine.generate(["Hi", "Hi"], [{"max_new_tokens": 4, "regex": "(x"}, {"max_new_tokens": 4}])
    assert outs[0]["meta_info"]["finish_reason"] == "abort" and "regex" in outs[0]["meta_info"]["error"]
    assert outs[1]["meta_info"]["error"] is None and outs[1]["meta_info"]["completion_tokens"] == 4
