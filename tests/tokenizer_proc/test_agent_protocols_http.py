"""/v1/responses and /v1/messages against a fake scheduler with scripted outputs, through the official
`openai` and `anthropic` clients and raw HTTP: bodies, event sequences, tool calls and their history,
the response store, reasoning output (this module's front end runs `--reasoning-parser qwen3`), the
API key as `x-api-key`, and each protocol's error shape."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from .conftest import Scripts
from .fakes import Front, start_front

anthropic = pytest.importorskip("anthropic")  # a test extra; absent on the GPU machine

KEY = "sk-test-key"
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
R_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather", "parameters": PARAMS}
A_TOOL = {"name": "get_weather", "description": "Current weather", "input_schema": PARAMS}
THINK_TEXT = "<think>\nThe user says hi.\n</think>\n\nHello!"


@pytest.fixture(scope="module")
def front(tokenizer: Any, tok_model_dir: Path, front_scripts: Scripts) -> Iterator[Front]:
    f = start_front(tokenizer, tok_model_dir, front_scripts, context_length=2048, api_key=KEY,
                    reasoning_parser="qwen3")
    yield f
    f.stop()


def oai(fr: Front) -> openai.OpenAI:
    return openai.OpenAI(base_url=fr.base_url + "/v1", api_key=KEY, max_retries=0, timeout=30)


def ant(fr: Front) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fr.base_url, api_key=KEY, max_retries=0, timeout=30)


def post(fr: Front, path: str, body: Any, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(fr.base_url + path, content=content, timeout=30,
                      headers={"authorization": f"Bearer {KEY}", "content-type": "application/json",
                               **headers})


def named_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """Strict `event: <name>` + `data: <json>` framing; no `[DONE]`."""
    out = []
    for block in text.split("\n\n")[:-1]:
        head, data = block.split("\n")
        assert head.startswith("event: ") and data.startswith("data: "), block
        out.append((head[len("event: "):], orjson.loads(data[len("data: "):])))
    assert "[DONE]" not in text
    return out


def prompt_text(fr: Front, tokenizer: Any) -> str:
    return tokenizer.decode(fr.sched.received[-1].input_ids)


# ----- Responses -----

def test_responses_plain_and_stored(fr: Front) -> None:
    r = oai(fr).responses.create(model=fr.served_model, input="Say hi", instructions="Be brief.")
    assert r.status == "completed" and r.output_text == "Hello there! 😀 世界, ok."
    assert [o.type for o in r.output] == ["message"] and r.id.startswith("resp_")
    assert r.usage.input_tokens == len(fr.sched.received[-1].input_ids)
    assert r.usage.input_tokens_details.cached_tokens >= 0 and r.instructions == "Be brief."
    again = oai(fr).responses.retrieve(r.id)
    assert again.output_text == r.output_text
    oai(fr).responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        oai(fr).responses.retrieve(r.id)


def test_a_response_being_generated_is_in_progress_and_can_be_deleted(fr: Front) -> None:
    """GET during generation answers the `in_progress` object, and a DELETE then is kept: nothing is
    stored when the stream ends (it was stored anyway, undoing the delete; break-it, 2026-12-05). A
    stream whose client leaves stores nothing."""
    auth = {"authorization": f"Bearer {KEY}"}
    body = {"model": fr.served_model, "input": "Say hi", "stream": True}

    def first_id(lines: Iterator[str]) -> str:
        for line in lines:
            if line.startswith("data: "):
                return orjson.loads(line[6:])["response"]["id"]
        raise AssertionError("no event")

    fr.sched.interval_s = 0.05
    try:
        with httpx.stream("POST", fr.base_url + "/v1/responses", json=body, headers=auth, timeout=30) as r:
            lines = r.iter_lines()
            rid = first_id(lines)
            got = httpx.get(f"{fr.base_url}/v1/responses/{rid}", headers=auth).json()
            assert got["status"] == "in_progress" and got["output"] == [] and got["id"] == rid
            assert httpx.delete(f"{fr.base_url}/v1/responses/{rid}", headers=auth).json()["deleted"]
            assert any('"response.completed"' in line for line in lines)  # read to the end
        assert httpx.get(f"{fr.base_url}/v1/responses/{rid}", headers=auth).status_code == 404
        with httpx.stream("POST", fr.base_url + "/v1/responses", json=body, headers=auth, timeout=30) as r:
            left = first_id(r.iter_lines())
        deadline = time.monotonic() + 10
        while httpx.get(f"{fr.base_url}/v1/responses/{left}", headers=auth).status_code != 404:
            assert time.monotonic() < deadline, "a left stream's response is still answered"
            time.sleep(0.05)
    finally:
        fr.sched.interval_s = 0.0
    done = post(fr, "/v1/responses", {"model": fr.served_model, "input": "Say hi"}).json()
    assert httpx.get(f"{fr.base_url}/v1/responses/{done['id']}", headers=auth).json()["status"] == "completed"


def test_responses_truncation_auto_drops_the_oldest_turns(fr: Front, tokenizer: Any) -> None:
    """`truncation: "auto"` drops whole turns from the start until the prompt fits the context (2,048
    here), keeping the instructions; "disabled" (the default) is the 400 (it was ignored; break-it,
    2026-12-05)."""
    def turn(tag: str, n: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"{tag} " + "apple " * n},
                {"type": "function_call", "call_id": f"c_{tag}", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": f"c_{tag}", "output": "sunny"},
                {"role": "assistant", "content": "ok"}]
    items = turn("FIRST", 1000) + turn("SECOND", 1000) + [{"role": "user", "content": "LAST question"}]
    tools = [{"type": "function", "name": "get_weather", "parameters": PARAMS}]
    body = {"model": fr.served_model, "input": items, "instructions": "Be brief.", "tools": tools}
    r = post(fr, "/v1/responses", body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    r = post(fr, "/v1/responses", {**body, "truncation": "auto"})
    assert r.status_code == 200 and r.json()["truncation"] == "auto", r.text
    ids = fr.sched.received[-1].input_ids.tolist()
    text = tokenizer.decode(ids)
    assert len(ids) < 2048 and "Be brief." in text and "LAST question" in text
    assert "FIRST" not in text and "SECOND" in text and "sunny" in text
    r = post(fr, "/v1/responses", {**body, "input": [{"role": "user", "content": "apple " * 3000}],
                                   "truncation": "auto"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_responses_stream_event_sequence(fr: Front) -> None:
    body = {"model": fr.served_model, "input": "Say hi", "stream": True}
    events = named_events(post(fr, "/v1/responses", body).text)
    assert all(name == data["type"] for name, data in events)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert [n for n, _ in events[:4]] == ["response.created", "response.in_progress",
                                          "response.output_item.added", "response.content_part.added"]
    assert [n for n, _ in events[-4:]] == ["response.output_text.done", "response.content_part.done",
                                           "response.output_item.done", "response.completed"]
    deltas = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    final = events[-1][1]["response"]
    assert deltas == final["output"][0]["content"][0]["text"] == "Hello there! 😀 世界, ok."
    assert final["usage"]["input_tokens"] > 0


def test_responses_function_call_then_output_turn(fr: Front, front_scripts: Scripts, tokenizer: Any) -> None:
    front_scripts.text = CALL_TEXT
    c = oai(fr)
    first = c.responses.create(model=fr.served_model, input="Weather in Paris?", tools=[R_TOOL],
                               tool_choice="required")
    assert fr.sched.received[-1].grammar_kind == "structural_tag"
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.arguments == '{"city": "Paris"}' and call.call_id.startswith("call_")
    front_scripts.text = "It is 18 C."
    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": call.call_id, "name": call.name,
              "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}]
    second = c.responses.create(model=fr.served_model, input=items, tools=[R_TOOL])
    explicit = list(fr.sched.received[-1].input_ids)
    assert second.output_text == "It is 18 C."
    text = prompt_text(fr, tokenizer)
    assert CALL_TEXT in text and "<tool_response>\n18 C\n</tool_response>" in text
    # the same turn through previous_response_id renders the same prompt
    c.responses.create(model=fr.served_model, previous_response_id=first.id, tools=[R_TOOL],
                       input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}])
    assert list(fr.sched.received[-1].input_ids) == explicit


def test_responses_stream_function_call(fr: Front, front_scripts: Scripts) -> None:
    front_scripts.text = CALL_TEXT
    with oai(fr).responses.stream(model=fr.served_model, input="Weather?", tools=[R_TOOL]) as s:
        types = [ev.type for ev in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.delta" in types and types[-1] == "response.completed"
    assert [o.type for o in final.output] == ["function_call"]
    assert final.output[0].arguments == '{"city": "Paris"}'


def test_responses_incomplete_and_text_format(fr: Front) -> None:
    r = oai(fr).responses.create(model=fr.served_model, input="hi", max_output_tokens=3, store=False)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[-1].status == "incomplete"  # the item the limit cut (was "completed")
    events = named_events(post(fr, "/v1/responses", {"model": fr.served_model, "input": "hi",
                                                     "max_output_tokens": 3, "stream": True}).text)
    done = [d["item"] for n, d in events if n == "response.output_item.done"]
    assert events[-1][0] == "response.incomplete" and done[-1]["status"] == "incomplete"
    assert events[-1][1]["response"]["output"][-1]["status"] == "incomplete"
    with pytest.raises(openai.NotFoundError):
        oai(fr).responses.retrieve(r.id)  # store=false
    fmt = {"type": "json_schema", "name": "city", "schema": PARAMS}
    oai(fr).responses.create(model=fr.served_model, input="hi", text={"format": fmt}, max_output_tokens=3)
    assert fr.sched.received[-1].grammar_kind is not None


BAD_RESPONSES = [
    ({"input": "hi", "include": "x"}, "include"),  # a 200 until 2026-12-05 (break-it)
    ({"input": "hi", "include": [5]}, "include[0]"),
    ({"input": [{"type": "web_search_call"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    # an output answering no function_call (break-it pass 2: was a 200), and one before its call
    ({"input": [{"type": "function_call_output", "call_id": "never", "output": "42"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c1", "output": "42"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]},
     "input[0].call_id"),
    ({"input": "hi", "previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x",
                                         "schema": {"type": "array", "uniqueItems": True}}}}, "text.format"),
    ({"input": "hi", "tool_choice": {"type": "function", "name": "nope"}, "tools": [R_TOOL]}, "tool_choice"),
    ({"input": "hi", "tool_choice": "bogus", "tools": [R_TOOL]}, "tool_choice"),
    ({"input": "hi", "tool_choice": {"type": "function"}, "tools": [R_TOOL]}, "tool_choice"),
]


@pytest.mark.parametrize("extra,param", BAD_RESPONSES)
def test_responses_bad_bodies_are_openai_400s(fr: Front, extra: dict[str, Any], param: str) -> None:
    r = post(fr, "/v1/responses", {"model": fr.served_model, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    if param == "tool_choice":  # Responses' named shape, not chat's {"function": {"name"}} (break-it pass 3)
        assert '"function": {' not in err["message"], err


# ----- Messages -----

def test_messages_plain_stream_and_count_tokens(fr: Front) -> None:
    c = ant(fr)
    msgs = [{"role": "user", "content": "Say hi"}]
    m = c.messages.create(model=fr.served_model, max_tokens=64, system="Be brief.", messages=msgs)
    prompt_len = len(fr.sched.received[-1].input_ids)
    assert m.type == "message" and m.role == "assistant" and m.stop_reason == "end_turn"
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == "Hello there! 😀 世界, ok."
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == prompt_len
    with c.messages.stream(model=fr.served_model, max_tokens=64, system="Be brief.", messages=msgs) as s:
        types = [ev.type for ev in s]
        final = s.get_final_message()
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    assert final.content[0].text == m.content[0].text and final.stop_reason == "end_turn"
    n = c.messages.count_tokens(model=fr.served_model, system="Be brief.", messages=msgs)
    assert n.input_tokens == prompt_len


def test_messages_tool_use_round_trip(fr: Front, front_scripts: Scripts, tokenizer: Any) -> None:
    front_scripts.text = CALL_TEXT
    c = ant(fr)
    q = [{"role": "user", "content": "Weather in Paris?"}]
    m = c.messages.create(model=fr.served_model, max_tokens=64, messages=q, tools=[A_TOOL],
                          tool_choice={"type": "any"})
    assert fr.sched.received[-1].grammar_kind == "structural_tag"
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
    use = m.content[0]
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")
    front_scripts.text = "It is 18 C."
    history = [*q, {"role": "assistant", "content": [b.model_dump() for b in m.content]},
               {"role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C"}]}]
    with c.messages.stream(model=fr.served_model, max_tokens=64, messages=history, tools=[A_TOOL]) as s:
        final = s.get_final_message()
    assert final.content[0].text == "It is 18 C." and final.stop_reason == "end_turn"
    text = prompt_text(fr, tokenizer)
    assert CALL_TEXT in text and "<tool_response>\n18 C\n</tool_response>" in text


def test_messages_stream_tool_use_and_stop_sequence(fr: Front, front_scripts: Scripts) -> None:
    front_scripts.text = CALL_TEXT
    body = {"model": fr.served_model, "max_tokens": 64, "stream": True, "tools": [A_TOOL],
            "messages": [{"role": "user", "content": "Weather?"}]}
    events = named_events(post(fr, "/v1/messages", body).text)
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert names.count("content_block_start") == names.count("content_block_stop") == 1
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    assert orjson.loads(partial) == {"city": "Paris"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    front_scripts.reset()
    m = ant(fr).messages.create(model=fr.served_model, max_tokens=64, stop_sequences=["there"],
                                messages=[{"role": "user", "content": "hi"}])
    assert (m.stop_reason, m.stop_sequence, m.content[0].text) == ("stop_sequence", "there", "Hello ")


BAD_MESSAGES = [
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "max_tokens"),
    ({"max_tokens": 8, "messages": []}, 400, "messages"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "hi"}]}, 400, "messages.0.role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "messages.0.content.0.type"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "temperature": 1.5}, 400,
     "temperature"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "bash_20250124", "name": "bash"}]}, 400, "tools"),
    # named as a server tool, not as a missing input_schema
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "only client tools"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
      "tools": [{"name": "f", "input_schema": {"type": "object"}},
                {"name": "g", "input_schema": {"type": "string"}}]}, 400, "tools.1.input_schema"),
    ({"max_tokens": 8, "model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
    # a tool_result answering no tool_use of the previous assistant turn (break-it pass 2: was a 200)
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "never", "content": "42"}]}]}, 400,
     "messages.0.content.0.tool_use_id"),
    # a non-text block inside a tool_result was dropped without a word (break-it pass 2, 2026-12-04)
    ({"max_tokens": 8, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1",
             "content": [{"type": "text", "text": "ok"}, {"type": "image", "source": {}}]}]}]}, 400,
     "messages.2.content.0.content.1.type"),
    # named by pydantic or by chat code as `messages[0]`; Anthropic's paths are dotted (break-it, 12-05)
    ({"max_tokens": 8, "messages": [5]}, 400, "messages.0"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
      "tools": [{"name": "f", "input_schema": {"type": "object"}}, {"input_schema": {"type": "object"}}]},
     400, "tools.1.name"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "stop_sequences": ["a", 5]},
     400, "stop_sequences.1"),
    # an empty tool_use id was named as the chat translation's `messages.2.tool_call_id`; is_error "yes"
    # was taken as true (break-it, 2026-12-05)
    ({"max_tokens": 8, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "", "content": "ok"}]}]}, 400,
     "messages.1.content.0.id"),
    ({"max_tokens": 8, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok",
                                      "is_error": "yes"}]}]}, 400,
     "messages.2.content.0.is_error"),
]


@pytest.mark.parametrize("body,status,field", BAD_MESSAGES)
def test_messages_bad_bodies_get_anthropic_errors(fr: Front, body: dict[str, Any], status: int,
                                                  field: str) -> None:
    r = post(fr, "/v1/messages", {"model": fr.served_model, **body})
    assert r.status_code == status, r.text
    data = r.json()
    assert data["type"] == "error" and set(data["error"]) == {"type", "message"}
    assert data["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert field in data["error"]["message"]
    assert not re.search(r"\[\d+\]", data["error"]["message"]), data  # no OpenAI-style `messages[0]`


def test_api_key_as_x_api_key_and_anthropic_401(fr: Front) -> None:
    body = {"model": fr.served_model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    ok = httpx.post(fr.base_url + "/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=30)
    assert ok.status_code == 200, ok.text
    bad = httpx.post(fr.base_url + "/v1/messages", json=body, headers={"x-api-key": "wrong"}, timeout=30)
    assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
    assert bad.json()["type"] == "error"
    r = httpx.post(fr.base_url + "/v1/responses", json={"model": fr.served_model, "input": "hi"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    not_json = post(fr, "/v1/messages", b"{not json")
    assert not_json.status_code == 400 and not_json.json()["type"] == "error"


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/v1/messages", 405), ("GET", "/v1/messages/count_tokens", 405),
    ("POST", "/v1/messages/count_tokens/x", 404), ("POST", "/v1/messages/batches", 404),
])
def test_unknown_paths_and_methods_under_messages_get_anthropic_errors(fr: Front, method: str, path: str,
                                                                       status: int) -> None:
    """The router's 404 / 405 under /v1/messages are in Anthropic's shape (break-it pass 3: OpenAI's);
    the status, and a 405's Allow header, stay."""
    r = httpx.request(method, fr.base_url + path, json={}, headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == status, r.text
    assert r.json() == {"type": "error", "error": {
        "type": "not_found_error" if status == 404 else "invalid_request_error",
        "message": "Not Found" if status == 404 else "Method Not Allowed"}}
    if status == 405:
        assert r.headers["allow"] == "POST"
    other = httpx.get(fr.base_url + "/v1/nothing", headers={"x-api-key": KEY}, timeout=30)
    assert other.status_code == 404 and other.json()["error"]["type"] == "not_found_error"


# ----- reasoning (--reasoning-parser qwen3) -----

def test_chat_reasoning_content_whole_and_streamed(fr: Front, front_scripts: Scripts) -> None:
    front_scripts.text = THINK_TEXT
    c = oai(fr)
    msgs = [{"role": "user", "content": "hi"}]
    m = c.chat.completions.create(model=fr.served_model, messages=msgs).choices[0].message
    assert (m.reasoning_content, m.content) == ("The user says hi.", "Hello!")
    chunks = list(c.chat.completions.create(model=fr.served_model, messages=msgs, stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    thought = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    answer = "".join(d.content or "" for d in deltas)
    assert (thought, answer) == ("The user says hi.", "Hello!")
    assert not any(getattr(d, "reasoning_content", None) and d.content for d in deltas)


def test_think_block_cut_by_max_tokens(fr: Front, front_scripts: Scripts) -> None:
    front_scripts.text = "<think>\nA long line of thought that goes on"
    ch = oai(fr).chat.completions.create(model=fr.served_model, max_tokens=6,
                                         messages=[{"role": "user", "content": "hi"}]).choices[0]
    assert ch.finish_reason == "length" and ch.message.content == ""
    assert ch.message.reasoning_content and "<think>" not in ch.message.reasoning_content


def test_reasoning_items_and_thinking_blocks(fr: Front, front_scripts: Scripts) -> None:
    front_scripts.text = THINK_TEXT
    r = oai(fr).responses.create(model=fr.served_model, input="hi")
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "The user says hi." and r.output_text == "Hello!"
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    m = ant(fr).messages.create(model=fr.served_model, max_tokens=64,
                                messages=[{"role": "user", "content": "hi"}])
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in m.content] == [
        ("thinking", "The user says hi."), ("text", "Hello!")]
    body = {"model": fr.served_model, "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    events = named_events(post(fr, "/v1/messages", body).text)
    kinds = [d["delta"]["type"] for n, d in events if n == "content_block_delta"]
    assert kinds[0] == "thinking_delta" and kinds[-1] == "text_delta"


def test_messages_assistant_prefill_is_continued(fr: Front, tokenizer: Any) -> None:
    """A final assistant turn is Anthropic's prefill: the prompt ends inside it (no end of turn, no new
    generation prompt) and the reply is only the continuation (break-it pass 2, 2026-12-04: the turn
    was closed and a new answer started). Trailing whitespace in the prefill is a 400, as Anthropic's."""
    msgs = [{"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "The capital of France is"}]
    m = ant(fr).messages.create(model=fr.served_model, max_tokens=64, messages=msgs)
    assert m.content[0].text == "Hello there! 😀 世界, ok."  # the scripted continuation, nothing prepended
    prompt = prompt_text(fr, tokenizer)
    assert prompt.endswith("The capital of France is"), prompt
    assert prompt.count("<|im_start|>assistant") == 1
    r = post(fr, "/v1/messages", {"model": fr.served_model, "max_tokens": 8,
                                  "messages": [msgs[0], {"role": "assistant", "content": "It is "}]})
    assert r.status_code == 400 and "trailing whitespace" in r.json()["error"]["message"]
    assert "messages.1.content" in r.json()["error"]["message"]


def test_chat_continue_final_message(fr: Front, tokenizer: Any) -> None:
    """vLLM's continue_final_message on chat completions: the prompt ends inside the last assistant
    message; it needs add_generation_prompt false and a final assistant message (400 otherwise)."""
    msgs = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "My favourite is"}]
    body = {"model": fr.served_model, "messages": msgs, "max_tokens": 4}
    cont = {"continue_final_message": True, "add_generation_prompt": False}
    r = post(fr, "/v1/chat/completions", {**body, **cont})
    assert r.status_code == 200, r.text
    assert prompt_text(fr, tokenizer).endswith("My favourite is")
    for extra in ({"continue_final_message": True},
                  {"continue_final_message": True, "add_generation_prompt": False, "messages": msgs[:1]}):
        r = post(fr, "/v1/chat/completions", {**body, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text
