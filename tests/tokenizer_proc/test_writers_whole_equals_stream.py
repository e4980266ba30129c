"""The Responses and Messages writers: a whole (non-streamed) body holds the items / blocks a stream of
the same output builds, in the same order with the same statuses, also when max_tokens cuts a tool
call or the output continues after calls (the writers run one machine for both paths)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixrt.tokenizer_proc.messages_writer import MessagesWriter
from radixrt.tokenizer_proc.reasoning_parser import get_reasoning_parser
from radixrt.tokenizer_proc.request_state import SampleEvent
from radixrt.tokenizer_proc.respond import Collected
from radixrt.tokenizer_proc.responses_writer import ResponsesWriter
from radixrt.tokenizer_proc.tool_parsers import get_tool_parser

CALL = '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{}"}}}}\n</tool_call>'
OUTPUTS = [
    # (text, finish_reason)
    ("Hello there.", "stop"),
    (CALL.format("Paris"), "stop"),
    ("Let me check. " + CALL.format("Paris"), "stop"),
    # cut by max_tokens inside the first call's arguments
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city":', "length"),
    # two calls, then text that max_tokens cut: the text is last, not first
    (CALL.format("Paris") + "\n" + CALL.format("Rome") + "\n</tool_call", "length"),
    ("<think>\nPlanning.\n</think>\n\n" + CALL.format("Oslo") + "\nDone.", "stop"),
    ("", "stop"),
]


def _events(text: str, finish: str, step: int) -> list[SampleEvent]:
    pieces = [text[i:i + step] for i in range(0, len(text), step)] or [""]
    n = len(pieces)
    return [SampleEvent(0, p, [], [], finish if i == n - 1 else None, None, 7, i + 1, 0)
            for i, p in enumerate(pieces)]


def _collected(text: str, finish: str, step: int = 1) -> dict[int, Collected]:
    """The whole choice the same events add up to (token counts are the last event's)."""
    c = Collected()
    for ev in _events(text, finish, step):
        c.add(ev)
    return {0: c}


def _strip_ids(obj: Any) -> Any:
    """Drop the random ids (items, calls, blocks) so two runs compare."""
    if isinstance(obj, dict):
        return {k: _strip_ids(v) for k, v in obj.items() if k not in ("id", "call_id", "created_at")}
    if isinstance(obj, list):
        return [_strip_ids(v) for v in obj]
    return obj


# the other parsers' formats, whole and cut (the writers run the same machine whatever the parser)
OTHER_OUTPUTS = [
    ("pythonic", '[get_weather(city="Paris"), get_weather(city="Rome")]\nDone.', "stop"),
    ("pythonic", '<|python_start|>[get_weather(city="Par', "length"),
    ("pythonic", "Sure. [get_weather(city=1e999)]", "stop"),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}', "stop"),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Os', "length"),
    ("llama3_json", "No call here.", "stop"),
]


def _responses_writer(parser: str = "hermes") -> ResponsesWriter:
    return ResponsesWriter({"id": "resp_x", "model": "m"}, get_reasoning_parser("qwen3"),
                           get_tool_parser(parser), count_tokens=len)


def _messages_writer(parser: str = "hermes") -> MessagesWriter:
    return MessagesWriter({"id": "msg_x", "model": "m"}, [], get_reasoning_parser("qwen3"),
                          get_tool_parser(parser))


@pytest.mark.parametrize("text, finish", OUTPUTS)
@pytest.mark.parametrize("step", [1, 5, 1000])
def test_responses_body_is_the_streamed_response(text: str, finish: str, step: int) -> None:
    w = _responses_writer()
    for ev in _events(text, finish, step):
        w.event(ev, [])
    streamed = w.final
    whole = _responses_writer().body(_collected(text, finish, step))
    assert _strip_ids(whole) == _strip_ids(streamed)
    if finish == "length":  # the item the cut ended is the incomplete one: the last, in output order
        assert [i["status"] for i in whole["output"]][-1] == "incomplete"
        assert all(i["status"] == "completed" for i in whole["output"][:-1])


def test_responses_order_follows_the_output() -> None:
    """Two calls then cut text (the tester's case): function_call, function_call, message."""
    text, finish = OUTPUTS[4]
    out = _responses_writer().body(_collected(text, finish))["output"]
    assert [(i["type"], i["status"]) for i in out] == [
        ("function_call", "completed"), ("function_call", "completed"), ("message", "incomplete")]
    assert [json.loads(i["arguments"]) for i in out[:2]] == [{"city": "Paris"}, {"city": "Rome"}]


def test_responses_call_cut_by_max_tokens_is_an_incomplete_function_call() -> None:
    text, finish = OUTPUTS[3]
    body = _responses_writer().body(_collected(text, finish))
    assert body["status"] == "incomplete"
    assert [(i["type"], i["name"], i["arguments"], i["status"]) for i in body["output"]] == [
        ("function_call", "get_weather", '{"city":', "incomplete")]


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_responses_whole_call_before_a_cut_header_stays_completed(step: int) -> None:
    """max_tokens cut a second call's header, which the parser drops: the first call was whole, so it
    is "completed" (break-it pass of 2026-12-05: it was marked "incomplete", and an agent that skips
    cut calls lost it); the response is still incomplete."""
    from radixrt.tokenizer_proc.tool_parser_base import CallsOnly

    def forced() -> ResponsesWriter:  # tool_choice "required": the cut header is dropped
        return ResponsesWriter({"id": "resp_x", "model": "m"}, get_reasoning_parser("qwen3"),
                               CallsOnly(get_tool_parser("hermes")), count_tokens=len)

    text = CALL.format("Paris") + '\n<tool_call>\n{"na'
    w = forced()
    for ev in _events(text, "length", step):
        w.event(ev, [])
    whole = forced().body(_collected(text, "length", step))
    assert _strip_ids(whole) == _strip_ids(w.final)
    assert whole["status"] == "incomplete" and whole["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [(i["type"], i["arguments"], i["status"]) for i in whole["output"]] == [
        ("function_call", '{"city": "Paris"}', "completed")]
    # not forced: the cut header is text, and that message is the incomplete item
    auto = _responses_writer().body(_collected(text, "length", step))
    assert [(i["type"], i["status"]) for i in auto["output"]] == [
        ("function_call", "completed"), ("message", "incomplete")]


def test_responses_error_events_carry_one_code() -> None:
    """A mid-stream error's `error` event and its `response.failed` name the same code."""
    from radixrt.tokenizer_proc.errors import APIError

    for err, want in [(APIError(400, "no valid next token"), "invalid_request_error"),
                      (APIError(500, "worker died"), "server_error"),
                      (APIError(503, "shutting down", code="unavailable"), "unavailable")]:
        events = _sse(_responses_writer().error_events(err))
        assert [n for n, _ in events] == ["error", "response.failed"]
        assert events[0][1]["code"] == want and events[1][1]["response"]["error"]["code"] == want, events


def _streamed_blocks(events: list[tuple[str, dict[str, Any]]]) -> tuple[list[dict[str, Any]], str]:
    """Rebuild a message's blocks from its SSE events (input from the joined partial_json)."""
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    reason = ""
    for name, data in events:
        if name == "content_block_start":
            blocks.append(dict(data["content_block"]))
        elif name == "content_block_delta":
            d = data["delta"]
            if d["type"] == "input_json_delta":
                partial[data["index"]] = partial.get(data["index"], "") + d["partial_json"]
            else:
                key = "text" if d["type"] == "text_delta" else "thinking"
                blocks[data["index"]][key] += d[key]
        elif name == "message_delta":
            reason = data["delta"]["stop_reason"]
    for i, text in partial.items():
        try:
            value = json.loads(text)
        except ValueError:
            value = {}
        blocks[i]["input"] = value if isinstance(value, dict) else {}
    return blocks, reason


def _sse(parts: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in b"".join(parts).decode().split("\n\n")[:-1]:
        head, data = block.split("\n")
        out.append((head[len("event: "):], json.loads(data[len("data: "):])))
    return out


@pytest.mark.parametrize("text, finish", OUTPUTS)
@pytest.mark.parametrize("step", [1, 5, 1000])
def test_messages_body_is_the_streamed_message(text: str, finish: str, step: int) -> None:
    w = _messages_writer()
    parts: list[bytes] = []
    for ev in _events(text, finish, step):
        w.event(ev, parts)
    blocks, reason = _streamed_blocks(_sse(parts))
    whole = _messages_writer().body(_collected(text, finish, step))
    assert _strip_ids(whole["content"]) == _strip_ids(blocks)
    assert whole["stop_reason"] == reason


def test_messages_order_follows_the_output_and_a_cut_call_is_tool_use() -> None:
    text, finish = OUTPUTS[4]
    body = _messages_writer().body(_collected(text, finish))
    assert [b["type"] for b in body["content"]] == ["tool_use", "tool_use", "text"]
    assert body["stop_reason"] == "max_tokens"
    text, finish = OUTPUTS[3]
    body = _messages_writer().body(_collected(text, finish))
    assert [(b["type"], b["name"], b["input"]) for b in body["content"]] == [("tool_use", "get_weather", {})]


@pytest.mark.parametrize("parser, text, finish", OTHER_OUTPUTS)
@pytest.mark.parametrize("step", [1, 7, 1000])
def test_other_parsers_whole_equals_stream(parser: str, text: str, finish: str, step: int) -> None:
    w = _responses_writer(parser)
    for ev in _events(text, finish, step):
        w.event(ev, [])
    assert _strip_ids(_responses_writer(parser).body(_collected(text, finish, step))) == _strip_ids(w.final)
    m = _messages_writer(parser)
    parts: list[bytes] = []
    for ev in _events(text, finish, step):
        m.event(ev, parts)
    blocks, reason = _streamed_blocks(_sse(parts))
    whole = _messages_writer(parser).body(_collected(text, finish, step))
    assert (_strip_ids(whole["content"]), whole["stop_reason"]) == (_strip_ids(blocks), reason)


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_text_after_a_call_starts_its_own_block_without_the_gap(step: int) -> None:
    """"Let me check. <call> Then I answer.": chat's content keeps the gap between the two texts (its
    one string), while Responses and Messages put the second text in its own item / block, without
    the gap as a leading space."""
    text = "Let me check. " + CALL.format("Paris") + " Then I answer."
    out = _responses_writer().body(_collected(text, "stop", step))["output"]
    texts = [i["content"][0]["text"] for i in out if i["type"] == "message"]
    assert texts == ["Let me check.", "Then I answer."]
    w = _messages_writer()
    parts: list[bytes] = []
    for ev in _events(text, "stop", step):
        w.event(ev, parts)
    blocks, _ = _streamed_blocks(_sse(parts))
    assert [b["text"] for b in blocks if b["type"] == "text"] == ["Let me check.", "Then I answer."]
