"""POST /v1/responses request bodies, validated, and their translation onto a chat completion request.

The Responses API is served as a translation at the HTTP edge: `input` items become chat messages
(`message` -> a message of its role, `function_call` -> an assistant turn's `tool_calls`,
`function_call_output` -> a role "tool" message, `reasoning` -> the next assistant turn's
`reasoning_content`), `instructions` a leading system message, `tools` / `tool_choice` the chat tool
fields, `text.format` the chat `response_format`, `max_output_tokens` `max_tokens`. The result is a
ChatCompletionRequest that takes the chat path (serving_chat.serve_chat) unchanged.

Same conventions as openai_protocol.py: strict pydantic, unknown fields ignored, every error a 400
whose `param` names the field (`input[2].call_id`, `tools[0].name`, `text.format`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .errors import APIError, bad_request, from_validation_error
from .openai_base import _Strict
from .openai_protocol import ChatCompletionRequest
from .tool_protocol import CHOICE_WORDS, FunctionDefinition

_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_ROLES = ("user", "assistant", "system", "developer")


class ResponsesTool(FunctionDefinition):
    """`tools[i]`: a function tool, flat (`name`, `parameters` at the top). Other tool types: 400."""

    type: Literal["function"]

    @model_validator(mode="before")
    @classmethod
    def _function_only(cls, v: Any) -> Any:
        kind = v.get("type") if isinstance(v, dict) else None
        if kind != "function":  # checked before the function fields, which other tool types lack
            raise PydanticCustomError("tool_type", "type: only function tools are supported by this "
                                      "server, got {kind}", {"kind": repr(kind)})
        return v

    def chat_dict(self) -> dict[str, Any]:
        """The chat completions `tools[i]` of this tool."""
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters,
              "strict": self.strict}
        return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


class TextFormat(_Strict):
    """`text.format`: free text, any JSON object, or JSON matching `schema`."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None

    def response_format(self) -> dict[str, Any]:
        """The chat `response_format` of this format."""
        if self.type != "json_schema":
            return {"type": self.type}
        if self.schema_ is None:
            raise bad_request('text.format: type "json_schema" needs a "schema"', param="text.format")
        return {"type": "json_schema", "json_schema": {"name": self.name or "output", "schema": self.schema_,
                                                       "strict": self.strict}}


class TextConfig(_Strict):
    format: TextFormat | None = None


class ResponsesRequest(_Strict):
    """POST /v1/responses. `input` items are checked one by one in `chat_messages` (their errors name
    `input[i]...`). `store` defaults to true as in OpenAI (a bounded in-memory store, docs/api.md)."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool | None = False
    store: bool | None = True
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    include: list[str] | None = None  # accepted and ignored, but of OpenAI's type (a string was a 200)
    truncation: Literal["auto", "disabled"] | None = None  # auto: oldest turns dropped to fit the context
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None

    @field_validator("metadata")
    @classmethod
    def _metadata_shape(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        """OpenAI's limits: at most 16 pairs, keys of <= 64 characters, string values of <= 512 (the
        response echoes it, so a nested value would also be echoed)."""
        if v is None:
            return v
        if len(v) > 16:
            raise ValueError(f"at most 16 key-value pairs, got {len(v)}")
        for k, x in v.items():
            if len(k) > 64:
                raise ValueError(f"key {k[:64]!r}...: keys are at most 64 characters")
            if not isinstance(x, str) or len(x) > 512:
                raise ValueError(f"value of {k!r}: values are strings of at most 512 characters")
        return v

    def unsupported(self) -> APIError | None:
        """A 400 for a field this server cannot honour (never silently ignored), else None."""
        if self.background:
            return bad_request("background responses are not supported by this server", param="background")
        if self.conversation is not None:
            return bad_request("conversations are not supported by this server; use previous_response_id",
                               param="conversation")
        if self.prompt is not None:
            return bad_request("stored prompt templates are not supported by this server", param="prompt")
        return None


def _part_text(part: Any, where: str) -> str:
    if not isinstance(part, dict):
        raise bad_request(f"{where}: expected a content part object", param=where)
    kind = part.get("type")
    if kind not in _TEXT_PARTS:
        raise bad_request(f"{where}.type: only text content is supported, got {kind!r}",
                          param=f"{where}.type")
    text = part.get("text")
    if not isinstance(text, str):
        raise bad_request(f"{where}.text: expected a string", param=f"{where}.text")
    return text


def _content_text(content: Any, where: str, sep: str) -> str:
    """A string, or a list of text parts joined with `sep`."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}: expected a string or a list of content parts", param=where)
    return sep.join(_part_text(p, f"{where}[{i}]") for i, p in enumerate(content))


def _str_field(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (key != "arguments" and not value):
        raise bad_request(f"{where}.{key}: expected a non-empty string", param=f"{where}.{key}")
    return value


def _assistant(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message that a call or reasoning item joins: the last one unless a turn intervened."""
    if messages and messages[-1]["role"] == "assistant":
        return messages[-1]
    messages.append({"role": "assistant", "content": None})
    return messages[-1]


def _add_item(messages: list[dict[str, Any]], item: Any, where: str, pending_reasoning: list[str],
              call_ids: set[str] | None) -> None:
    if not isinstance(item, dict):
        raise bad_request(f"{where}: expected an input item object", param=where)
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise bad_request(f"{where}.role: must be one of {', '.join(_ROLES)}, got {role!r}",
                              param=f"{where}.role")
        text = _content_text(item.get("content"), f"{where}.content", "" if role == "assistant" else "\n")
        msg: dict[str, Any] = {"role": role, "content": text}
        if role == "assistant" and pending_reasoning:
            msg["reasoning_content"] = "\n".join(pending_reasoning)
            pending_reasoning.clear()
        messages.append(msg)
    elif kind == "function_call":
        call = {"id": _str_field(item, "call_id", where), "type": "function",
                "function": {"name": _str_field(item, "name", where),
                             "arguments": _str_field(item, "arguments", where)}}
        if call_ids is not None:
            call_ids.add(call["id"])
        msg = _assistant(messages)
        msg.setdefault("tool_calls", []).append(call)
        if pending_reasoning:
            msg["reasoning_content"] = "\n".join(pending_reasoning)
            pending_reasoning.clear()
    elif kind == "function_call_output":
        output = _content_text(item.get("output"), f"{where}.output", "\n")
        call_id = _str_field(item, "call_id", where)
        if call_ids is not None and call_id not in call_ids:  # OpenAI's 400 too
            raise bad_request(f"{where}.call_id: no function_call with call_id {call_id!r} in the input "
                              "or the previous response", param=f"{where}.call_id")
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
    elif kind == "reasoning":
        parts = item.get("content") or item.get("summary") or []
        pending_reasoning.append(_content_text(parts, f"{where}.content", "\n"))
    else:
        raise bad_request(f"{where}.type: unsupported input item type {kind!r} (supported: message, "
                          "function_call, function_call_output, reasoning)", param=f"{where}.type")


def input_messages(input_: str | list[dict[str, Any]],
                   history: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """`input` as chat messages (dicts of ToolChatMessage's fields). With `history` (the chat messages
    before this input: a previous response's turn, possibly []), every function_call_output must
    answer a function_call of the history or of an earlier input item.

    Raises:
        APIError: 400 naming the item at fault, e.g. `input[2].call_id`.
    """
    if isinstance(input_, str):
        return [{"role": "user", "content": input_}]
    call_ids = None if history is None else {c["id"] for m in history for c in m.get("tool_calls") or ()}
    messages: list[dict[str, Any]] = []
    pending: list[str] = []
    for i, item in enumerate(input_):
        _add_item(messages, item, f"input[{i}]", pending, call_ids)
    return messages


def _tool_choice(choice: Any) -> Any:
    """Responses' tool_choice in chat's shape; a wrong one is refused here, in Responses' own terms."""
    if choice is None or (isinstance(choice, str) and choice in CHOICE_WORDS):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request('tool_choice: must be "none", "auto", "required" or {"type": "function", "name": ...}, '
                      f"got {choice!r}", param="tool_choice")


def to_chat_request(req: ResponsesRequest, history: list[dict[str, Any]],
                    turn: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request that serves `req`: instructions, the stored `history` (previous_response_id),
    then this turn's messages.

    Raises:
        APIError: 400 when the translated request fails chat validation (e.g. a tool_choice naming a
            function that is not in tools) or is empty.
    """
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages = system + history + turn
    if not messages:
        raise bad_request("input: must not be empty", param="input")
    body: dict[str, Any] = {
        "model": req.model, "messages": messages, "max_tokens": req.max_output_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "stream": bool(req.stream),
        "tool_choice": _tool_choice(req.tool_choice), "parallel_tool_calls": req.parallel_tool_calls,
    }
    if req.tools:
        body["tools"] = [t.chat_dict() for t in req.tools]
    if req.text is not None and req.text.format is not None:
        body["response_format"] = req.text.format.response_format()
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as e:
        raise from_validation_error(e) from None
