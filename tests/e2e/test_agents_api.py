"""Agents on the real default model: tool calling and structured outputs through the official openai
client, the OpenAI Agents SDK and LangChain, plus the agent loop's prefix-cache hit.

Several tests assert what only grammar enforcement guarantees: a 135M model writes a valid call or
schema-valid JSON because it cannot write anything else.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
from typing import Any

import openai
import pytest

from tests.agent_tools import run_weather_agent
from tests.conftest import Server

MODEL = "SmolLM2-135M-Instruct"
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                  "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": WEATHER_PARAMS}}
QUESTION = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the weather in Paris?"}]
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"], "additionalProperties": False}


def validate(instance: Any, schema: dict[str, Any]) -> None:
    """jsonschema.validate (imported here: a machine without jsonschema still collects the module)."""
    pytest.importorskip("jsonschema").validate(instance, schema)



def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=300)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_choice_makes_a_valid_call(server: Server, choice: Any) -> None:
    r = client(server).chat.completions.create(model=MODEL, messages=QUESTION, tools=[WEATHER],
                                               tool_choice=choice, parallel_tool_calls=False,
                                               temperature=0, max_tokens=128)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    # one call (parallel_tool_calls false): the grammar ends after it, so the model can only stop
    assert ch.message.content is None and len(ch.message.tool_calls) == 1
    for call in ch.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name == "get_weather"
        validate(json.loads(call.function.arguments), WEATHER_PARAMS)


def test_tool_history_is_accepted_and_hits_the_prefix_cache(server: Server) -> None:
    c = client(server)
    first = c.chat.completions.create(model=MODEL, messages=QUESTION, tools=[WEATHER], temperature=0,
                                      max_tokens=8)
    history = [*QUESTION,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
    second = c.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], temperature=0,
                                       max_tokens=24)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 0.9 * first.usage.prompt_tokens, (cached, first.usage.prompt_tokens)


def test_json_schema_outputs_validate_at_temperature_1(server: Server) -> None:
    c = client(server)
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    msgs = [{"role": "user", "content": "Describe a person as JSON with a name and an age."}]

    def one(seed: int) -> tuple[str, str | None]:
        r = c.chat.completions.create(model=MODEL, messages=msgs, response_format=rf, temperature=1.0,
                                      seed=seed, max_tokens=96)
        return r.choices[0].message.content or "", r.choices[0].finish_reason

    with cf.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, range(20)))
    for text, finish in outs:
        assert finish == "stop", text
        validate(json.loads(text), PERSON)


def test_regex_output_fullmatches(server: Server) -> None:
    c = client(server)
    pattern = r"(yes|no), [0-9]{1,3} (cats|dogs)\."
    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Any pets?"}],
                                     temperature=0.8, seed=3, max_tokens=32, extra_body={"regex": pattern})
    assert re.fullmatch(pattern, chat.choices[0].message.content), chat.choices[0].message.content
    comp = c.completions.create(model=MODEL, prompt="Do you have pets? Answer:", temperature=0.8, seed=3,
                                max_tokens=32, extra_body={"regex": pattern})
    assert re.fullmatch(pattern, comp.choices[0].text), comp.choices[0].text


def test_bad_schema_is_a_400_and_the_server_keeps_serving(server: Server) -> None:
    c = client(server)
    bad = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": bad}})
    assert e.value.status_code == 400 and e.value.param == "response_format"
    assert "uniqueItems" in e.value.message
    with pytest.raises(openai.BadRequestError) as e2:
        c.completions.create(model=MODEL, prompt="Hi", max_tokens=4, extra_body={"regex": "(a"})
    assert e2.value.param == "regex"
    ok = c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0)
    assert ok.choices[0].message.content is not None


def test_agents_sdk_runs_a_function_tool(server: Server) -> None:
    agents = pytest.importorskip("agents")
    result, calls = run_weather_agent(agents, openai, f"{server.base_url}/v1", MODEL, "none")
    assert calls and all(isinstance(c, str) for c in calls)
    assert result.final_output == f"18 C and sunny in {calls[0]}"


def _langchain(server: Server) -> Any:
    lc = pytest.importorskip("langchain_openai")
    return lc.ChatOpenAI(base_url=f"{server.base_url}/v1", api_key="none", model=MODEL, temperature=0,
                         max_tokens=96, max_retries=0, timeout=300)


def test_langchain_bind_tools(server: Server) -> None:
    llm = _langchain(server)

    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "sunny"

    bound = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False)
    msg = bound.invoke("What is the weather in Paris?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    assert isinstance(msg.tool_calls[0]["args"].get("city"), str)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output(server: Server, method: str) -> None:
    llm = _langchain(server)
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        """A person."""

        name: str = Field(max_length=20)
        age: int = Field(ge=0, le=150)

    out = llm.with_structured_output(Person, method=method).invoke("Invent a person with a name and age.")
    assert isinstance(out, Person)
    assert 0 <= out.age <= 150 and len(out.name) <= 20
