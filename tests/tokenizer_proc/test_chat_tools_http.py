"""Structured outputs and tool calling over HTTP, against a fake scheduler: 400 bodies that name the
parameter, the grammar each request's GenerateReq carries, tool-call responses built from a scripted
model output (JSON and SSE agree), finish reasons."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from .conftest import Scripts
from .fakes import Front
from .test_openai_api import sse_events

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
MSGS = [{"role": "user", "content": "Weather in Paris?"}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def chat(fr: Front, **kw: Any) -> httpx.Response:
    body = {"model": fr.served_model, "messages": MSGS, "max_tokens": 160, **kw}
    return httpx.post(fr.base_url + "/v1/chat/completions", json=body, timeout=30)


def completion(fr: Front, **kw: Any) -> httpx.Response:
    body = {"model": fr.served_model, "prompt": "Hi", "max_tokens": 64, **kw}
    return httpx.post(fr.base_url + "/v1/completions", json=body, timeout=30)


def error_of(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    return err


BAD_CHAT = [
    ({"response_format": {"type": "json_object"}, "regex": "a+"}, "regex"),
    ({"regex": "a+", "ebnf": 'root ::= "a"'}, "ebnf"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"t": {"type": "array", "uniqueItems": True}}}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"json_schema": "{not json"}, "json_schema"),
    ({"regex": "(a"}, "regex"),
    ({"regex": "(?<=a)b"}, "regex"),
    ({"ebnf": "root ::= "}, "ebnf"),
    ({"ebnf": 'start ::= "a"'}, "ebnf"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}],
      "tool_choice": "required"}, "tools"),
]


@pytest.mark.parametrize(("extra", "param"), BAD_CHAT)
def test_chat_constraint_errors_are_400s_naming_the_param(fr: Front, extra: dict[str, Any],
                                                          param: str) -> None:
    err = error_of(chat(fr, **extra))
    assert err["param"] == param, err
    assert not fr.sched.received  # rejected before anything reached the scheduler
    assert chat(fr).status_code == 200  # and the server keeps serving


@pytest.mark.parametrize(("extra", "param"), [
    ({"regex": "a+", "json_schema": json.dumps(SCHEMA)}, "json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "not": {}}}}}, "response_format"),
    ({"ebnf": "root ::= ("}, "ebnf"),
])
def test_completion_constraint_errors(fr: Front, extra: dict[str, Any], param: str) -> None:
    assert error_of(completion(fr, **extra))["param"] == param
    assert not fr.sched.received


def test_history_with_bad_tool_message(fr: Front) -> None:
    msgs = [*MSGS, {"role": "tool", "content": "18 C"}]
    assert error_of(chat(fr, messages=msgs))["param"] == "messages[1].tool_call_id"


@pytest.mark.parametrize(("extra", "kind", "needle"), [
    ({"response_format": {"type": "json_object"}}, "json_object", ""),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA,
                                                                 "strict": True}}}, "json_schema", '"a"'),
    ({"json_schema": json.dumps(SCHEMA)}, "json_schema", '"a"'),
    ({"regex": "[0-9]{3}"}, "regex", "[0-9]{3}"),
    ({"ebnf": 'root ::= "yes" | "no"'}, "ebnf", '"yes"'),
])
def test_constraint_travels_in_generate_req(fr: Front, extra: dict[str, Any], kind: str,
                                            needle: str) -> None:
    for r in (chat(fr, **extra), completion(fr, **extra)):
        assert r.status_code == 200, r.text
    assert [(g.grammar_kind, needle in g.grammar_text) for g in fr.sched.received] == [(kind, True)] * 2


def test_unconstrained_requests_carry_no_grammar(fr: Front) -> None:
    for r in (chat(fr, response_format={"type": "text"}), completion(fr), chat(fr, tools=[WEATHER])):
        assert r.status_code == 200, r.text
    assert [g.grammar_kind for g in fr.sched.received] == [None, None, None]


def test_tool_grammar_wins_for_forced_choice_only(fr: Front) -> None:
    rf = {"type": "json_object"}
    named = {"type": "function", "function": {"name": "get_time"}}
    for extra in ({"tool_choice": "required"}, {"tool_choice": named}, {"tool_choice": "auto"},
                  {"tool_choice": "none"}):
        assert chat(fr, tools=[WEATHER, TIME], response_format=rf, **extra).status_code == 200
    kinds = [g.grammar_kind for g in fr.sched.received]
    assert kinds == ["structural_tag", "structural_tag", "json_object", "json_object"]
    required, named_req = (json.loads(g.grammar_text) for g in fr.sched.received[:2])
    assert "get_weather" in json.dumps(required) and "get_time" in json.dumps(required)
    assert "get_weather" not in json.dumps(named_req) and "get_time" in json.dumps(named_req)


def test_stops_do_not_apply_to_a_forced_call(fr: Front) -> None:
    """A stop string inside a forced call cut its arguments ("{") or the whole call while the reply said
    "tool_calls" (break-it, 2026-12-05): forced choices (chat's "required" / named, Messages' "any")
    carry no stop strings or stop token ids to the scheduler; "auto" and "none" keep them."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    stops = {"stop": ['"city"', "name"], "stop_token_ids": [7]}
    n = len(fr.sched.received)
    for extra in ({"tool_choice": "required"}, {"tool_choice": named}, {"tool_choice": "auto"},
                  {"tool_choice": "none"}):
        assert chat(fr, tools=[WEATHER], **stops, **extra).status_code == 200
    body = {"model": fr.served_model, "max_tokens": 16, "messages": MSGS, "stop_sequences": ['"city"'],
            "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],
            "tool_choice": {"type": "any"}}
    assert httpx.post(fr.base_url + "/v1/messages", json=body, timeout=30).status_code == 200
    got = [(q.sampling["stop"], q.sampling["stop_token_ids"]) for q in fr.sched.received[n:]]
    kept = (stops["stop"], stops["stop_token_ids"])
    assert got == [([], []), ([], []), kept, kept, ([], [])]


def test_tools_are_rendered_into_the_prompt(fr: Front, tokenizer: Any) -> None:
    assert chat(fr, tools=[WEATHER], tool_choice="none").status_code == 200
    prompt = tokenizer.decode(list(fr.sched.received[0].input_ids))
    assert '"name": "get_weather"' in prompt and "<tool_call>" in prompt


def _stream_message(r: httpx.Response) -> tuple[str | None, list[dict[str, Any]], list[str | None]]:
    content, calls, finishes = None, {}, []
    for ev in sse_events(r):
        for ch in ev["choices"]:
            d = ch["delta"]
            if d.get("content"):
                content = (content or "") + d["content"]
            for tc in d.get("tool_calls") or []:
                if "id" in tc:
                    assert tc["index"] not in calls and tc["type"] == "function"
                    calls[tc["index"]] = {"name": tc["function"]["name"], "arguments": ""}
                else:
                    assert set(tc) == {"index", "function"}
                calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
            if ch["finish_reason"] is not None:
                finishes.append(ch["finish_reason"])
    return content, [calls[i] for i in sorted(calls)], finishes


@pytest.mark.parametrize(("text", "want_content", "want_calls", "finish"), [
    (CALL_TEXT, None, [("get_weather", '{"city": "Paris"}')], "tool_calls"),
    ("Let me check.\n" + CALL_TEXT + "\n" + CALL_TEXT.replace("Paris", "Rome"), "Let me check.",
     [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')], "tool_calls"),
    ("It is sunny in Paris.", "It is sunny in Paris.", [], "stop"),
    ("<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", [], "stop"),
])
def test_tool_call_responses_stream_and_json_agree(fr: Front, front_scripts: Scripts, text: str,
                                                   want_content: str | None,
                                                   want_calls: list[tuple[str, str]], finish: str) -> None:
    front_scripts.text = text
    r = chat(fr, tools=[WEATHER])
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    msg = choice["message"]
    assert msg["content"] == want_content and choice["finish_reason"] == finish
    got = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []]
    assert got == want_calls
    for c in msg.get("tool_calls") or []:
        assert c["type"] == "function" and c["id"].startswith("call_")
    content, calls, finishes = _stream_message(chat(fr, tools=[WEATHER], stream=True))
    assert (content or None) == (want_content or None)
    assert [(c["name"], c["arguments"]) for c in calls] == want_calls
    assert finishes == [finish]


def test_tool_choice_none_leaves_calls_as_content(fr: Front, front_scripts: Scripts) -> None:
    front_scripts.text = CALL_TEXT
    choice = chat(fr, tools=[WEATHER], tool_choice="none").json()["choices"][0]
    assert choice["message"]["content"] == CALL_TEXT and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"


def test_length_finish_stays_length_and_n_choices_each_finish_once(fr: Front, front_scripts: Scripts) -> None:
    front_scripts.text = CALL_TEXT
    ids = front_scripts.ids()
    r = chat(fr, tools=[WEATHER], max_tokens=len(ids) - 3)
    assert r.json()["choices"][0]["finish_reason"] == "length"
    events = sse_events(chat(fr, tools=[WEATHER], stream=True, n=3))
    finishes: dict[int, list[str]] = {}
    for ev in events:
        for ch in ev["choices"]:
            if ch["finish_reason"] is not None:
                finishes.setdefault(ch["index"], []).append(ch["finish_reason"])
    assert finishes == {0: ["tool_calls"], 1: ["tool_calls"], 2: ["tool_calls"]}


def test_history_with_calls_and_results_is_accepted(fr: Front, tokenizer: Any) -> None:
    history = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    r = chat(fr, messages=history, tools=[WEATHER])
    assert r.status_code == 200, r.text
    prompt = tokenizer.decode(list(fr.sched.received[0].input_ids))
    assert CALL_TEXT in prompt and "<tool_response>\n18 C, sunny\n</tool_response>" in prompt
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0
