"""The Responses and Messages APIs on the real default model through the official clients and the
OpenAI Agents SDK's Responses model: plain, streamed, forced tool calls and the turn after them,
radix-cache hits reported in each protocol's usage, and each protocol's 4xx error shape."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from tests.agent_tools import weather_tool
from tests.conftest import Server

anthropic = pytest.importorskip("anthropic")  # a test extra; absent on the GPU machine

MODEL = "SmolLM2-135M-Instruct"
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
          "required": ["city"], "additionalProperties": False}
R_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
          "parameters": PARAMS, "strict": True}
A_TOOL = {"name": "get_weather", "description": "Current weather in a city", "input_schema": PARAMS}
GREEDY = {"temperature": 0}  # the anthropic client has no temperature argument; the API takes it
SYSTEM = "You are a helpful assistant who answers questions about the weather in one short sentence."


def oai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=300)


def ant(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="none", max_retries=0, timeout=300)


def test_responses_plain_and_streamed(server: Server) -> None:
    c = oai(server)
    r = c.responses.create(model=MODEL, input="Say hello.", instructions=SYSTEM, max_output_tokens=8,
                           temperature=0)
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 8
    events = list(c.responses.create(model=MODEL, input="Say hello.", instructions=SYSTEM,
                                     max_output_tokens=8, temperature=0, stream=True))
    assert [ev.sequence_number for ev in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == f"response.{r.status}"
    deltas = "".join(ev.delta for ev in events if ev.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text == r.output_text  # greedy: the same text both ways
    assert final.usage.input_tokens_details.cached_tokens > 0  # same prompt again: a radix-cache hit


def test_responses_required_tool_then_function_call_output(server: Server) -> None:
    c = oai(server)
    first = c.responses.create(model=MODEL, instructions=SYSTEM, input="What is the weather in Paris?",
                               tools=[R_TOOL], tool_choice="required", parallel_tool_calls=False,
                               temperature=0, max_output_tokens=48)
    calls = [o for o in first.output if o.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1
    assert calls[0].name == "get_weather" and isinstance(json.loads(calls[0].arguments)["city"], str)
    second = c.responses.create(model=MODEL, previous_response_id=first.id, tools=[R_TOOL], temperature=0,
                                max_output_tokens=12, instructions=SYSTEM,
                                input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                        "output": "18 C and sunny"}])
    assert second.output and second.usage.input_tokens > first.usage.input_tokens
    # the first turn's prompt and its generated call are served from the radix cache
    assert second.usage.input_tokens_details.cached_tokens >= 0.9 * first.usage.input_tokens


def test_agents_sdk_responses_model_runs_a_tool_to_a_final_answer(server: Server) -> None:
    agents = pytest.importorskip("agents")
    get_weather, calls = weather_tool(agents)

    agents.set_tracing_disabled(True)
    model = agents.OpenAIResponsesModel(
        model=MODEL, openai_client=openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="none",
                                                      max_retries=0, timeout=300))
    # tool_choice "required" on the first turn (the SDK resets it after the call, so the model answers)
    agent = agents.Agent(name="weather", instructions="Answer with the weather tool.", model=model,
                         tools=[get_weather],
                         model_settings=agents.ModelSettings(tool_choice="required", temperature=0,
                                                             parallel_tool_calls=False, max_tokens=96))
    result = asyncio.run(agents.Runner.run(agent, "What is the weather in Paris?", max_turns=4))
    assert calls and all(isinstance(c, str) for c in calls)
    assert isinstance(result.final_output, str) and result.final_output.strip()


def test_messages_plain_streamed_and_cache_reads(server: Server) -> None:
    c = ant(server)
    msgs = [{"role": "user", "content": "Say hello."}]
    m = c.messages.create(model=MODEL, max_tokens=8, system=SYSTEM, messages=msgs, extra_body=GREEDY)
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and 0 < m.usage.output_tokens <= 8
    with c.messages.stream(model=MODEL, max_tokens=8, system=[{"type": "text", "text": SYSTEM}],
                           messages=[{"role": "user", "content": "Say goodbye."}], extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == final.content[0].text
    # the repeated system prompt is a radix-cache hit, reported as Anthropic's prompt-cache read
    assert final.usage.cache_read_input_tokens > 0
    n = c.messages.count_tokens(model=MODEL, system=SYSTEM, messages=msgs)
    assert n.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_messages_tool_use_round_trip(server: Server) -> None:
    c = ant(server)
    q = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = c.messages.create(model=MODEL, max_tokens=48, system=SYSTEM, messages=q, tools=[A_TOOL],
                          tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body=GREEDY)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(uses) == 1 and isinstance(uses[0].input["city"], str)
    history = [*q, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                             "content": "18 C and sunny"}]}]
    after = c.messages.create(model=MODEL, max_tokens=12, system=SYSTEM, messages=history, tools=[A_TOOL],
                              extra_body=GREEDY)
    assert after.content and after.stop_reason in ("end_turn", "max_tokens", "tool_use")
    first_prompt = m.usage.input_tokens + m.usage.cache_read_input_tokens
    assert after.usage.cache_read_input_tokens >= 0.9 * first_prompt


def test_bad_bodies_get_each_protocols_4xx(server: Server) -> None:
    r = httpx.post(f"{server.base_url}/v1/responses", json={"model": MODEL, "input": [{"type": "nope"}]},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].type"
    with pytest.raises(openai.BadRequestError):
        oai(server).responses.create(model=MODEL, input="hi", previous_response_id="resp_missing")
    with pytest.raises(anthropic.BadRequestError) as e:
        ant(server).messages.create(model=MODEL, max_tokens=8,
                                    messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        ant(server).messages.create(model="claude-unknown", max_tokens=8,
                                    messages=[{"role": "user", "content": "hi"}])
