"""Tool fields of a chat request: accepted shapes, and 400s that name the parameter."""

from __future__ import annotations

from typing import Any

import pytest

from radixrt.tokenizer_proc.errors import APIError
from radixrt.tokenizer_proc.openai_protocol import ChatCompletionRequest
from radixrt.tokenizer_proc.request_checks import parse_body
from radixrt.tokenizer_proc.tool_protocol import NamedToolChoice, ToolChatMessage

# ChatCompletionRequest now carries ToolFields and ToolChatMessage messages (the wiring is done).
ToolChatRequest = ChatCompletionRequest


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
USER = {"role": "user", "content": "Weather in Paris?"}


def body(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [USER], **kw}


def reject(obj: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as e:
        parse_body(ToolChatRequest, obj)
    assert e.value.status == 400
    return e.value


def test_full_agent_request_parses() -> None:
    history = [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    named = {"type": "function", "function": {"name": "get_weather"}}
    req = parse_body(ToolChatRequest, body(messages=history, tools=[WEATHER], tool_choice=named,
                                           parallel_tool_calls=False))
    assert isinstance(req.tool_choice, NamedToolChoice) and req.tool_choice.function.name == "get_weather"
    assert not req.allows_parallel()
    call = req.messages[1].tool_calls[0]
    assert call.function.arguments_text() == '{"city": "Paris"}'
    assert call.function.arguments_object() == {"city": "Paris"}
    assert req.tools[0].schema()["required"] == ["city"]


def test_defaults_follow_openai() -> None:
    assert parse_body(ToolChatRequest, body(tools=[WEATHER])).effective_tool_choice() == "auto"
    plain = parse_body(ToolChatRequest, body())
    assert plain.effective_tool_choice() == "none" and plain.allows_parallel()
    assert parse_body(ToolChatRequest, body(tool_choice="auto")).effective_tool_choice() == "auto"


def test_object_arguments_in_history_are_accepted() -> None:
    msg = ToolChatMessage.model_validate({"role": "assistant", "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": {"b": [1, "é"]}}}]})
    assert msg.tool_calls[0].function.arguments_text() == '{"b": [1, "é"]}'
    assert msg.tool_calls[0].type == "function"


@pytest.mark.parametrize(("tools", "param", "needle"), [
    ([{"type": "function", "function": {"name": "bad name!"}}], "tools[0].function.name", "letters"),
    ([{"type": "function", "function": {"name": "x" * 65}}], "tools[0].function.name", "1-64"),
    ([WEATHER, {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
     "tools[1].function.parameters", '"object"'),
    ([{"type": "function", "function": {"name": "f", "parameters": {"properties": []}}}],
     "tools[0].function.parameters", "properties"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"required": "city"}}}],
     "tools[0].function.parameters", "required"),
    ([{"type": "retrieval", "function": {"name": "f"}}], "tools[0].type", "function"),
    ([{"type": "function"}], "tools[0].function", "required"),
    ([{"type": "function", "function": {"description": "no name"}}], "tools[0].function.name", ""),
    ([WEATHER, WEATHER], "tools", "tools[0] and tools[1]"),
    ("get_weather", "tools", "list"),
])
def test_malformed_tools_name_the_parameter(tools: Any, param: str, needle: str) -> None:
    err = reject(body(tools=tools))
    assert err.param == param and needle in err.message


@pytest.mark.parametrize(("choice", "tools", "needle"), [
    ({"type": "function", "function": {"name": "send_email"}}, [WEATHER], "'send_email' is not in tools"),
    ({"type": "function", "function": {"name": "get_weather"}}, None, "not in tools"),
    ("required", None, "non-empty tools"),
    ("sometimes", [WEATHER], '"required"'),
    ({"type": "tool", "function": {"name": "get_weather"}}, [WEATHER], 'type must be "function"'),
    ({"type": "function", "name": "get_weather"}, [WEATHER], '"function": {"name"'),
    (3, [WEATHER], "must be"),
])
def test_bad_tool_choice_is_a_400_on_tool_choice(choice: Any, tools: Any, needle: str) -> None:
    err = reject(body(tools=tools, tool_choice=choice))
    assert err.param == "tool_choice" and needle in err.message


@pytest.mark.parametrize(("message", "needle"), [
    ({"role": "user", "content": "x", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}, "tool_calls"),
    ({"role": "tool", "content": "18 C"}, "tool_call_id"),
])
def test_tool_fields_must_fit_the_role(message: dict[str, Any], needle: str) -> None:
    err = reject(body(messages=[USER, message]))
    assert err.param == f"messages[1].{needle}" and err.message.startswith(f"messages[1].{needle}: ")


def test_parallel_tool_calls_is_strictly_boolean() -> None:
    err = reject(body(tools=[WEATHER], parallel_tool_calls="yes"))
    assert err.param == "parallel_tool_calls"


def test_a_tool_result_must_answer_an_earlier_call() -> None:
    """A role "tool" message answers a call of an earlier assistant message (OpenAI's 400 too; the
    Responses and Messages APIs refuse their orphans the same way)."""
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    user = {"role": "user", "content": "hi"}
    answered = {"role": "assistant", "content": None, "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    ok = parse_body(ChatCompletionRequest, {"model": "m", "messages": [user, answered, result]})
    assert ok.messages[-1].tool_call_id == "call_1"
    for messages in ([user, result],                                   # no call at all
                     [user, result, answered],                         # the call comes after its result
                     [user, answered, {**result, "tool_call_id": "call_2"}]):  # another call's id
        with pytest.raises(APIError) as err:
            parse_body(ChatCompletionRequest, {"model": "m", "messages": messages})
        assert err.value.status == 400 and "tool_call_id" in str(err.value)
