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


def test_greedy_constrained_outputs_are_the_same_with_overlap_on_and_off(engine: Engine) -> None:
    """Overlap on: constrained requests run in every pass with deferred mask rows (the worker waits
    for them before sampling); their greedy tokens equal the overlap-off ones."""
    sps = [{"temperature": 0.0, "max_new_tokens": 40, "json_schema": json.dumps(SCHEMA)},
           {"temperature": 0.0, "max_new_tokens": 12, "regex": r"(red|green|blue) [0-9]{2,3}"},
           {"temperature": 0.0, "max_new_tokens": 6}]
    prompts = [PROMPT, "Name a colour and a number:", "The capital of France is"]
    outs = {}
    passes = []
    remove = engine.pipeline.add_pass_hook(lambda rec: passes.append(
        {it.req.rid for it in rec.sb.items if it.req.matcher is not None}))
    try:
        for overlap in (False, True):
            engine.overlap = overlap
            passes.clear()
            outs[overlap] = [o["output_ids"] for o in engine.generate(prompts, sps)]
            if overlap:  # the JSON request decodes in every pass from its first to its last
                json_rid = max((rid for p in passes for rid in p), key=lambda r: sum(r in p for p in passes))
                steps = [k for k, p in enumerate(passes) if json_rid in p]
                assert steps == list(range(steps[0], steps[-1] + 1)) and len(steps) > 10
    finally:
        engine.overlap = True
        remove()
    assert outs[True] == outs[False]
