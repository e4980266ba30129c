"""POST /v1/messages (Anthropic Messages API) request bodies, validated, and their translation onto a
chat completion request.

Translation at the HTTP edge: `system` (a string or text blocks) -> a leading system message; a user
turn's `tool_result` blocks -> role "tool" messages (in block order, before the turn's text); an
assistant turn's `text` blocks -> its content, `tool_use` blocks -> its `tool_calls` (the `input`
object as JSON text), `thinking` blocks -> its `reasoning_content`; `tools[i].input_schema` -> the
function's `parameters`; `tool_choice` auto / any / tool / none -> "auto" / "required" / a named
function / "none" (`disable_parallel_tool_use` -> `parallel_tool_calls: false`); `stop_sequences` ->
`stop`. The result takes the chat path (serving_chat.serve_chat) unchanged.

Errors are 400s whose message starts with the field (`messages.1.content.0.tool_use_id: ...`,
Anthropic's dotted paths), rendered in Anthropic's error shape by the handler.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from .errors import bad_request, from_validation_error
from .openai_base import _Strict
from .openai_protocol import ChatCompletionRequest
from .protocol_errors import renamed
from .tool_protocol import FunctionDefinition


class MessagesTool(_Strict):
    """`tools[i]`: a client tool (`type` absent or "custom"); server tools (bash, web search) are 400s."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _client_tools_only(cls, data: Any) -> Any:
        # before the fields, so that a server tool (which has no input_schema) is named as one
        if isinstance(data, dict) and data.get("type") not in (None, "custom"):
            raise ValueError(f"only client tools (with an input_schema) are supported, got type "
                             f"{data.get('type')!r}")
        return data

    def chat_dict(self) -> dict[str, Any]:
        """The chat completions `tools[i]` (FunctionDefinition validates the name and schema)."""
        fn = FunctionDefinition(name=self.name, description=self.description, parameters=self.input_schema)
        return {"type": "function", "function": fn.model_dump(exclude_none=True)}


class MessagesToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessagesRequest(_Strict):
    """POST /v1/messages. `messages` items are checked in `chat_messages` (errors name
    `messages.<i>.content.<j>`)."""

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)
    stream: bool | None = False
    tools: list[MessagesTool] | None = None
    tool_choice: MessagesToolChoice | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None  # accepted; the think block is the model's (--reasoning-parser)


class CountTokensRequest(MessagesRequest):
    """POST /v1/messages/count_tokens: a Messages body without `max_tokens`."""

    max_tokens: int = Field(default=1, ge=1)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}: expected a string or a list of content blocks", param=where)
    for j, b in enumerate(content):
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise bad_request(f"{where}.{j}: expected a content block with a type", param=f"{where}.{j}")
    return content


def _text_of(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise bad_request(f"{where}.{key}: expected a string", param=f"{where}.{key}")
    return value


def _id_of(block: dict[str, Any], key: str, where: str) -> str:
    """A tool_use `id` / tool_result `tool_use_id`: a non-empty string (an empty one failed later in
    the chat translation, whose 400 named `messages.<i>.tool_call_id`, a field Messages has not)."""
    value = _text_of(block, key, where)
    if not value:
        raise bad_request(f"{where}.{key}: must not be empty", param=f"{where}.{key}")
    return value


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    """A `tool_result`'s content as text: a string, or text blocks joined by newlines. Any other
    block (image, document, search results) is a 400 naming it, as at a turn's top level: dropping
    it would hand the model an empty result without a word."""
    content = block.get("content", "")
    parts = _blocks(content, f"{where}.content")
    for k, b in enumerate(parts):
        if b["type"] != "text":
            at = f"{where}.content.{k}.type"
            raise bad_request(f"{at}: unsupported content block {b['type']!r} in a tool_result "
                              "(supported: text)", param=at)
    text = "\n".join(_text_of(b, "text", f"{where}.content.{k}") for k, b in enumerate(parts))
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool) and is_error is not None:
        raise bad_request(f"{where}.is_error: expected a boolean", param=f"{where}.is_error")
    return f"Error: {text}" if is_error else text


def _user_turn(blocks: list[dict[str, Any]], where: str, tool_use_ids: set[str]) -> list[dict[str, Any]]:
    """A user turn's chat messages; its tool_result blocks must answer `tool_use_ids`, the tool_use
    blocks of the assistant turn just before (Anthropic's rule, and its 400)."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, b in enumerate(blocks):
        at = f"{where}.{j}"
        if b["type"] == "text":
            texts.append(_text_of(b, "text", at))
        elif b["type"] == "tool_result":
            use_id = _id_of(b, "tool_use_id", at)
            if use_id not in tool_use_ids:
                raise bad_request(f"{at}.tool_use_id: unexpected tool_use_id {use_id!r}: no tool_use block "
                                  "with that id in the previous assistant message", param=f"{at}.tool_use_id")
            out.append({"role": "tool", "tool_call_id": use_id, "content": _tool_result_text(b, at)})
        else:
            raise bad_request(f"{at}.type: unsupported content block {b['type']!r} in a user turn "
                              "(supported: text, tool_result)", param=f"{at}.type")
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant_turn(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts, calls, thoughts = [], [], []
    for j, b in enumerate(blocks):
        at = f"{where}.{j}"
        if b["type"] == "text":
            texts.append(_text_of(b, "text", at))
        elif b["type"] == "tool_use":
            args = b.get("input", {})
            if not isinstance(args, dict):
                raise bad_request(f"{at}.input: expected an object", param=f"{at}.input")
            calls.append({"id": _id_of(b, "id", at), "type": "function",
                          "function": {"name": _text_of(b, "name", at),
                                       "arguments": json.dumps(args, ensure_ascii=False)}})
        elif b["type"] == "thinking":
            thoughts.append(_text_of(b, "thinking", at))
        elif b["type"] != "redacted_thinking":
            raise bad_request(f"{at}.type: unsupported content block {b['type']!r} in an assistant turn "
                              "(supported: text, tool_use, thinking)", param=f"{at}.type")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    if thoughts:
        msg["reasoning_content"] = "\n".join(thoughts)
    return msg


def chat_messages(req: MessagesRequest) -> list[dict[str, Any]]:
    """`system` + `messages` as chat messages (dicts of ToolChatMessage's fields).

    Raises:
        APIError: 400 naming the block at fault, e.g. `messages.2.content.0.tool_use_id`.
    """
    out: list[dict[str, Any]] = []
    if req.system:
        blocks = _blocks(req.system, "system")
        out.append({"role": "system", "content": "\n".join(_text_of(b, "text", f"system.{k}")
                                                            for k, b in enumerate(blocks))})
    tool_use_ids: set[str] = set()  # the previous assistant turn's, for the next user turn's tool_results
    for i, m in enumerate(req.messages):
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise bad_request(f"messages.{i}.role: must be \"user\" or \"assistant\", got {role!r}",
                              param=f"messages.{i}.role")
        blocks = _blocks(m.get("content"), f"messages.{i}.content")
        if role == "user":
            out.extend(_user_turn(blocks, f"messages.{i}.content", tool_use_ids))
            tool_use_ids = set()
        else:
            out.append(_assistant_turn(blocks, f"messages.{i}.content"))
            tool_use_ids = {c["id"] for c in out[-1].get("tool_calls") or ()}
    return out


def _tool_choice(choice: MessagesToolChoice | None) -> tuple[Any, bool | None]:
    if choice is None:
        return None, None
    parallel = False if choice.disable_parallel_tool_use else None
    if choice.type == "tool":
        if not choice.name:
            raise bad_request('tool_choice.name: required with type "tool"', param="tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def to_chat_request(req: MessagesRequest, stream: bool | None = None) -> ChatCompletionRequest:
    """The chat request that serves `req`.

    Raises:
        APIError: 400 as chat_messages, or when the translation fails chat validation.
    """
    choice, parallel = _tool_choice(req.tool_choice)
    messages = chat_messages(req)
    body: dict[str, Any] = {
        "model": req.model, "messages": messages, "max_tokens": req.max_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
        "stream": bool(req.stream if stream is None else stream), "stop": req.stop_sequences or None,
        "tool_choice": choice, "parallel_tool_calls": parallel,
    }
    tools = []
    for i, t in enumerate(req.tools or ()):
        try:
            tools.append(t.chat_dict())
        except ValidationError as e:  # named by the Messages field: tools.<i>.input_schema / .name
            raise renamed(from_validation_error(e), {"parameters": f"tools.{i}.input_schema",
                                                     "name": f"tools.{i}.name"}) from None
    body["tools"] = tools or None
    last = messages[-1]
    if last["role"] == "assistant" and last.get("content") and not last.get("tool_calls"):
        # Anthropic's prefill: the reply continues the final assistant turn (only the continuation
        # is returned), which Anthropic refuses to end with whitespace
        where = f"messages.{len(req.messages) - 1}.content"
        if (last.get("content") or "") != (last.get("content") or "").rstrip():
            raise bad_request(f"{where}: final assistant content cannot end with trailing whitespace",
                              param=where)
        body["add_generation_prompt"], body["continue_final_message"] = False, True
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as e:
        raise from_validation_error(e) from None
