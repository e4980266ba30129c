"""Grammar-constrained decoding through the real server on the default model: /generate's SGLang
sampling_params keys (regex, ebnf, json_schema) with the same 400s as chat and completions, and
tool calls at temperature 0 that are identical whether streamed or not."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import Server
from tests.e2e.test_agents_api import MODEL, QUESTION, WEATHER, client

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}},
          "required": ["name"], "additionalProperties": False}


def generate(server: Server, sampling: dict[str, Any], text: str = "Answer:") -> httpx.Response:
    params = {"temperature": 0, "max_new_tokens": 32, **sampling}
    return httpx.post(f"{server.base_url}/generate", timeout=300,
                      json={"text": text, "sampling_params": params})


@pytest.mark.parametrize(("key", "value", "check"), [
    ("regex", r"(yes|no)-[0-9]{2}", lambda t: re.fullmatch(r"(yes|no)-[0-9]{2}", t)),
    ("ebnf", 'root ::= "cat" | "dog"', lambda t: t in ("cat", "dog")),
    ("json_schema", json.dumps(PERSON), lambda t: set(json.loads(t)) == {"name"}),
])
def test_generate_sampling_params_constrain_the_output(server: Server, key: str, value: str, check) -> None:
    r = generate(server, {key: value})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["meta_info"]["finish_reason"] == "stop", out
    assert check(out["text"]), out["text"]


@pytest.mark.parametrize(("sampling", "param"), [
    ({"regex": "(unclosed"}, "sampling_params.regex"),
    ({"json_schema": '{"type": "object", "uniqueItems": true, "not": {}}'}, "sampling_params.json_schema"),
    ({"regex": "a+", "ebnf": 'root ::= "a"'}, "sampling_params.ebnf"),
    ({"json_schema": {"type": "object"}}, "sampling_params.json_schema"),
])
def test_generate_bad_grammars_are_400s_and_the_next_request_succeeds(server: Server, sampling,
                                                                       param: str) -> None:
    r = generate(server, sampling)
    assert r.status_code == 400, r.text
    assert param in r.text
    ok = generate(server, {"max_new_tokens": 4})
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 4


def _streamed_calls(c: openai.OpenAI, **kw: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """(name, arguments) of each streamed call, joined from its deltas, and every finish_reason."""
    calls: dict[int, list[str]] = {}
    reasons = []
    for chunk in c.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, ["", ""])
                if tc.function and tc.function.name:
                    entry[0] += tc.function.name
                if tc.function and tc.function.arguments:
                    entry[1] += tc.function.arguments
            if ch.finish_reason is not None:
                reasons.append(ch.finish_reason)
    return [(name, args) for _, (name, args) in sorted(calls.items())], reasons


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_tool_calls_equal_the_non_streamed_ones_at_temperature_0(server: Server, choice) -> None:
    c = client(server)
    kw = dict(model=MODEL, messages=QUESTION, tools=[WEATHER], tool_choice=choice, temperature=0,
              parallel_tool_calls=False, max_tokens=128)
    full = c.chat.completions.create(**kw).choices[0]
    streamed, reasons = _streamed_calls(c, **kw)
    assert full.finish_reason == "tool_calls" and reasons == ["tool_calls"]
    want = [(t.function.name, t.function.arguments) for t in full.message.tool_calls]
    assert want and streamed == want
    assert all(json.loads(args)["city"] for _, args in want)
