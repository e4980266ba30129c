"""Prompt rendering with tools: the default tool prompt on the default model's template (and its
radix-cache prefix property over an agent loop), and a template with its own tool support."""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixrt.tokenizer_proc.tool_grammar import tool_grammar
from radixrt.tokenizer_proc.tool_parsers import get_tool_parser
from radixrt.tokenizer_proc.tool_prompt import (
    DEFAULT_TOOL_PROMPT_HEAD,
    default_template_messages,
    default_tool_system_prompt,
    render_call_block,
    render_chat,
    template_supports_tools,
)
from radixrt.tokenizer_proc.tool_protocol import ToolChatMessage, ToolDefinition

TOOLS = [ToolDefinition.model_validate(t) for t in [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time (ISO 8601)"}},
]]

# A template with tool support, written for this test (transformers' shapes: tools, tool_calls, "tool").
NATIVE_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTOOLS"
    "{% for t in tools %}{{ '\\n' }}{{ t | tojson }}{% endfor %}<|im_end|>\n"
    "{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<call>{{ c.function | tojson }}</call>{% endfor %}<|im_end|>\n"
    "{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def msgs(*items: dict[str, Any]) -> list[ToolChatMessage]:
    return [ToolChatMessage.model_validate(m) for m in items]


def call(cid: str, name: str, args: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def agent_turns(system: str | None) -> list[list[dict[str, Any]]]:
    """Histories of an agent loop, each the previous one plus one step."""
    h: list[dict[str, Any]] = ([{"role": "system", "content": system}] if system else [])
    h.append({"role": "user", "content": "Weather and time in Paris and Oslo?"})
    turns = [list(h)]
    h += [{"role": "assistant", "content": None,
           "tool_calls": [call("call_a", "get_weather", '{"city": "Paris"}')]},
          {"role": "tool", "tool_call_id": "call_a", "content": '{"temp_c": 18}'}]
    turns.append(list(h))
    h += [{"role": "assistant", "content": "Now Oslo, and the time.", "tool_calls": [
              call("call_b", "get_weather", '{"city":"Oslo"}'), call("call_c", "get_time", "{}")]},
          {"role": "tool", "tool_call_id": "call_b", "content": "4 C, rain"},
          {"role": "tool", "tool_call_id": "call_c", "content": "2026-12-01T10:00"}]
    turns.append(list(h))
    h += [{"role": "assistant", "content": "Paris 18 C, Oslo 4 C; it is 10:00."},
          {"role": "user", "content": "Thanks! And Rome?"}]
    turns.append(list(h))
    return turns


def test_default_template_has_no_tool_support(tokenizer: Any) -> None:
    assert not template_supports_tools(tokenizer.chat_template)
    assert template_supports_tools(NATIVE_TEMPLATE)
    assert not template_supports_tools(None)


@pytest.mark.parametrize("system", [None, "You are terse."])
def test_agent_loop_prompts_extend_each_other(tokenizer: Any, system: str | None) -> None:
    """Every turn's prompt ids (with the generation prompt) are a prefix of the next turn's: the whole
    earlier prompt is a radix-cache hit."""
    rendered = [render_chat(tokenizer, msgs(*h), TOOLS) for h in agent_turns(system)]
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in rendered]
    for i in range(len(ids) - 1):
        assert rendered[i + 1].startswith(rendered[i])
        assert ids[i + 1][: len(ids[i])] == ids[i], f"turn {i} is not a token prefix of turn {i + 1}"


def test_a_generated_call_renders_back_byte_identically(tokenizer: Any) -> None:
    """The text the forced grammar makes the model write is what the next turn's history renders, so the
    generated tokens (up to end-of-turn) are cached too."""
    turns = agent_turns(None)
    before = render_chat(tokenizer, msgs(*turns[0]), TOOLS)
    after = render_chat(tokenizer, msgs(*turns[1]), TOOLS)
    generated = render_call_block("get_weather", '{"city": "Paris"}')
    assert after.startswith(before + generated + tokenizer.eos_token)
    spec, _ = tool_grammar(TOOLS, "required", False)
    tag = json.loads(spec.text)["format"]["elements"][0]
    assert generated == tag["begin"] + '{"city": "Paris"}' + tag["end"]
    out = get_tool_parser("hermes").parse(generated)
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("get_weather", '{"city": "Paris"}')]


def test_default_prompt_shape() -> None:
    section = default_tool_system_prompt(TOOLS)
    assert section.startswith(DEFAULT_TOOL_PROMPT_HEAD)
    lines = section.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(x)["function"]["name"] for x in lines] == ["get_weather", "get_time"]
    assert json.loads(lines[1])["function"]["parameters"] == {"type": "object", "properties": {}}
    assert "<tool_call>" in section and "<tool_response>" in section

    history = msgs(*agent_turns("Be brief.")[2])
    out = default_template_messages(history, TOOLS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert out[0]["content"] == "Be brief.\n\n" + section
    assert out[2]["content"] == render_call_block("get_weather", '{"city": "Paris"}')
    assert out[4]["content"].startswith("Now Oslo, and the time.\n<tool_call>\n")
    assert out[4]["content"].count("<tool_call>") == 2
    assert out[5]["content"] == ("<tool_response>\n4 C, rain\n</tool_response>\n"
                                 "<tool_response>\n2026-12-01T10:00\n</tool_response>")
    assert default_template_messages(history, None)[0] == {"role": "system", "content": "Be brief."}


def test_no_tools_renders_like_the_plain_template(tokenizer: Any) -> None:
    m = msgs({"role": "developer", "content": "Sys"}, {"role": "user", "content": "Hi"})
    plain = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"}],
        tokenize=False, add_generation_prompt=True)
    assert render_chat(tokenizer, m, None) == plain
    assert render_chat(tokenizer, m, []) == plain


def test_native_template_gets_tools_and_object_arguments(tokenizer: Any) -> None:
    history = msgs(*agent_turns(None)[1])
    text = render_chat(tokenizer, history, TOOLS, chat_template=NATIVE_TEMPLATE)
    assert text.startswith("<|im_start|>system\nTOOLS\n")
    assert DEFAULT_TOOL_PROMPT_HEAD not in text
    tool_lines = text.split("<|im_end|>")[0].splitlines()[2:]
    assert [json.loads(x)["function"]["name"] for x in tool_lines] == ["get_weather", "get_time"]
    called = json.loads(text.split("<call>")[1].split("</call>")[0])
    assert called == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert "<|im_start|>tool\n{\"temp_c\": 18}<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_no_template_is_an_error() -> None:
    class Bare:
        chat_template = None

    with pytest.raises(ValueError, match="no chat template"):
        render_chat(Bare(), msgs({"role": "user", "content": "x"}), TOOLS)
