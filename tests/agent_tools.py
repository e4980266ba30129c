"""The function tool the OpenAI Agents SDK tests give their agents (one definition for every test)."""

from __future__ import annotations

from typing import Any


def weather_tool(agents: Any) -> tuple[Any, list[str]]:
    """An Agents SDK `get_weather` function tool and the list of cities it was called with."""
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city.

        Args:
            city: the city's name.
        """
        calls.append(city)
        return f"18 C and sunny in {city}"

    return get_weather, calls


def run_weather_agent(agents: Any, openai: Any, base_url: str, model: str,
                      api_key: str) -> tuple[Any, list[str]]:
    """Run an Agents SDK chat-completions agent that must call `get_weather` (tool_choice required,
    temperature 0) against base_url; returns (the run's result, the cities the tool got)."""
    import asyncio

    get_weather, calls = weather_tool(agents)
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=300)
    agent = agents.Agent(name="weather", instructions="Answer with the weather tool.",
                         model=agents.OpenAIChatCompletionsModel(model=model, openai_client=client),
                         tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                         model_settings=agents.ModelSettings(tool_choice="required", temperature=0,
                                                             parallel_tool_calls=False, max_tokens=96))
    return asyncio.run(agents.Runner.run(agent, "What is the weather in Paris?", max_turns=3)), calls
