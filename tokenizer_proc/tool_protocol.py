"""Request shapes of OpenAI tool calling: `tools`, `tool_choice`, `parallel_tool_calls`, and the chat
history items that carry calls (assistant `tool_calls`, role "tool" results).

Same conventions as openai_protocol.py (strict pydantic, unknown fields ignored); every error names its
parameter, either through its location (`tools[0].function.name`) or as a "param: ..." message prefix
that errors.from_validation_error turns into the error's `param`.

Wiring (done by the chat handler): ChatCompletionRequest gains the fields of `ToolFields` (inherit from
both), and its `messages` become `list[ToolChatMessage]`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from radixrt.json_depth import MAX_JSON_DEPTH, json_depth

from .json_limits import loads_bounded
from .openai_base import ChatMessage, _Strict

# OpenAI's rule for function names: letters, digits, underscores and dashes, at most 64 characters.
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CHOICE_WORDS = ("none", "auto", "required")
_CHOICE_HELP = 'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'


class FunctionDefinition(_Strict):
    """`tools[i].function`: a callable function with a JSON-schema `parameters` object."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not _FUNCTION_NAME.match(v):
            raise ValueError(f"must be 1-64 letters, digits, '_' or '-', got {v!r}")
        return v

    @field_validator("parameters")
    @classmethod
    def _parameters_shape(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        if "type" in v and v["type"] != "object":
            raise ValueError(f'must be a JSON schema of type "object", got type {v["type"]!r}')
        if "properties" in v and not isinstance(v["properties"], dict):
            raise ValueError("'properties' must be an object mapping names to schemas")
        required = v.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ValueError("'required' must be a list of property names")
        depth = json_depth(v)  # whatever tool_choice is: the schema is rendered into the prompt
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"nests {depth} levels deep; at most {MAX_JSON_DEPTH} are supported")
        return v


class ToolDefinition(_Strict):
    """`tools[i]`: only function tools exist in the chat API."""

    type: Literal["function"]
    function: FunctionDefinition

    def schema(self) -> dict[str, Any]:
        """The arguments' JSON schema; a function without `parameters` takes an empty object."""
        return self.function.parameters or {"type": "object", "properties": {}}

    def template_dict(self) -> dict[str, Any]:
        """The OpenAI dict a chat template's `tools` variable expects (None fields left out)."""
        fn: dict[str, Any] = {"name": self.function.name}
        if self.function.description is not None:
            fn["description"] = self.function.description
        fn["parameters"] = self.schema()
        return {"type": "function", "function": fn}


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`: call exactly this function."""

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(_Strict):
    """An earlier call in the history. OpenAI sends `arguments` as a JSON string; an object is accepted."""

    name: str
    arguments: str | dict[str, Any] = "{}"

    def arguments_text(self) -> str:
        """The arguments as JSON text, byte-identical to what was received when it was a string."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)

    def arguments_object(self) -> Any:
        """The arguments as a JSON value (what HF chat templates expect); unparseable text, or JSON
        nested deeper than MAX_JSON_DEPTH, stays text."""
        if not isinstance(self.arguments, str):
            return self.arguments
        try:
            return loads_bounded(self.arguments)
        except ValueError:
            return self.arguments


class AssistantToolCall(_Strict):
    """`messages[i].tool_calls[j]` of an assistant message."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolChatMessage(ChatMessage):
    """A chat message that may be an assistant turn with tool calls or a role "tool" result."""

    # validate_default: the checks below run when the field is absent too, so the error's location
    # (messages[i].tool_call_id) names it.
    tool_call_id: str | None = Field(default=None, validate_default=True)
    tool_calls: list[AssistantToolCall] | None = None

    @field_validator("tool_call_id")
    @classmethod
    def _tool_result_names_its_call(cls, v: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("role") == "tool" and not v:
            raise ValueError("a tool message must name the call it answers")
        return v

    @field_validator("tool_calls")
    @classmethod
    def _only_assistant_calls(cls, v: list[AssistantToolCall] | None,
                              info: ValidationInfo) -> list[AssistantToolCall] | None:
        role = info.data.get("role")
        if v and role != "assistant":
            raise ValueError(f"only assistant messages carry tool calls, not {role!r} ones")
        return v


class ToolFields(_Strict):
    """The tool fields of POST /v1/chat/completions, checked against each other.

    Raises (as a 400 through parse_body): a malformed tool (`tools[i].function.*`), two tools with one
    name (`tools`), a tool_choice of the wrong shape, or one that needs tools when there are none or
    names a function that is not in tools (`tool_choice`).
    """

    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _choice_shape(cls, v: Any) -> Any:
        if v is None or (isinstance(v, str) and v in CHOICE_WORDS):
            return v
        if isinstance(v, dict):
            fn = v.get("function")
            if v.get("type") != "function":
                raise ValueError(f'type must be "function" in a named tool_choice, got {v.get("type")!r}')
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ValueError('a named tool_choice needs "function": {"name": "<function name>"}')
            return v
        raise ValueError(f"{_CHOICE_HELP}, got {v!r}")

    @model_validator(mode="after")
    def _tools_agree(self) -> ToolFields:
        seen: dict[str, int] = {}
        for i, tool in enumerate(self.tools or []):
            name = tool.function.name
            if name in seen:
                raise ValueError(f"tools: tools[{seen[name]}] and tools[{i}] are both named {name!r}")
            seen[name] = i
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in seen:
            raise ValueError(f"tool_choice: function {choice.function.name!r} is not in tools")
        if choice == "required" and not seen:
            raise ValueError('tool_choice: "required" needs a non-empty tools list')
        return self

    def effective_tool_choice(self) -> Literal["none", "auto", "required"] | NamedToolChoice:
        """tool_choice with OpenAI's default: "auto" when tools are given, else "none"."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def allows_parallel(self) -> bool:
        """parallel_tool_calls, default true as in OpenAI."""
        return self.parallel_tool_calls is not False
