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
