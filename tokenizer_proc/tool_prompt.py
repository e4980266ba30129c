"""Messages + tools -> prompt text, with the chat template's own tool support or the default tool prompt.

A template that reads the `tools` variable renders the tools itself (transformers'
apply_chat_template(tools=...)) and gets the history in the transformers shape (assistant
`tool_calls` with object arguments, role "tool" messages). Any other template (the default
SmolLM2-135M-Instruct's has no tool support) gets the default tool prompt: a section of the system
message that lists the tools as JSON schemas and asks for hermes `<tool_call>` blocks, with earlier
calls rendered back as those blocks in assistant turns and tool results as `<tool_response>` blocks in
user turns, so only the roles every template knows are used.

Radix-cache property (tested): the system section depends only on the tools and the client's system
message, earlier turns render the same bytes however the history grows, and an assistant call renders
exactly as the grammar of tool_grammar.py makes the model write it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .openai_protocol import ChatMessage
from .tool_protocol import AssistantToolCall, ToolDefinition

DEFAULT_TOOL_PROMPT_HEAD = (
    "# Tools\n\n"
    "You can call functions to answer. Each available function is described below by a JSON schema of "
    "its arguments:\n<tools>\n"
)
DEFAULT_TOOL_PROMPT_TAIL = (
    "\n</tools>\n\n"
    "To call a function, write a JSON object with its name and its arguments inside "
    "<tool_call></tool_call> tags, one block per call:\n"
    '<tool_call>\n{"name": "<function name>", "arguments": {"<argument name>": <value>}}\n</tool_call>\n'
    "Each result comes back inside <tool_response></tool_response> tags."
)
CALL_OPEN, CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
CALL_SEPARATOR = "\n"


def template_supports_tools(chat_template: str | None) -> bool:
    """True when the Jinja template reads a `tools` variable (so it renders tool definitions itself)."""
    if not chat_template:
        return False
    try:
        import jinja2
        from jinja2 import meta

        return "tools" in meta.find_undeclared_variables(jinja2.Environment().parse(chat_template))
    except Exception:  # a template jinja2 cannot parse here (extensions): fall back to a text search
        return "tools" in chat_template


def default_tool_system_prompt(tools: Sequence[ToolDefinition]) -> str:
    """The default tool prompt's system section: one JSON line per tool, in the order given."""
    lines = "\n".join(json.dumps(t.template_dict(), ensure_ascii=False) for t in tools)
    return DEFAULT_TOOL_PROMPT_HEAD + lines + DEFAULT_TOOL_PROMPT_TAIL


def render_call_block(name: str, arguments: str) -> str:
    """One call in the hermes form the grammar forces: `<tool_call>\\n{"name": ..., "arguments": ...}\\n
    </tool_call>`; `arguments` (JSON text) goes in verbatim, so a call the model wrote renders back
    byte-identically."""
    name_json = json.dumps(name, ensure_ascii=False)
    return f'{CALL_OPEN}{{"name": {name_json}, "arguments": {arguments}}}{CALL_CLOSE}'


def _role(m: ChatMessage) -> str:
    return "system" if m.role == "developer" else m.role


def _native_call(c: AssistantToolCall) -> dict[str, Any]:
    return {"id": c.id, "type": "function",
            "function": {"name": c.function.name, "arguments": c.function.arguments_object()}}


def native_template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages for a template with tool support (transformers' shape: object arguments)."""
    out = []
    for m in messages:
        d: dict[str, Any] = {"role": _role(m), "content": m.flat_content()}
        if m.name is not None:
            d["name"] = m.name
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        calls = getattr(m, "tool_calls", None)
        if calls:
            d["tool_calls"] = [_native_call(c) for c in calls]
        out.append(d)
    return out


def default_template_messages(messages: Sequence[ChatMessage],
                              tools: Sequence[ToolDefinition] | None) -> list[dict[str, str]]:
    """Messages for a template without tool support, in plain system/user/assistant roles.

    The tool section joins the first system message (after its text and a blank line) or becomes a
    system message of its own; assistant calls become `<tool_call>` blocks after the content (one
    newline between); each run of consecutive tool results becomes one user message of
    `<tool_response>` blocks.
    """
    out: list[dict[str, str]] = []
    for m in messages:
        calls = getattr(m, "tool_calls", None)
        if m.role == "tool":
            block = f"<tool_response>\n{m.flat_content()}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": "1"})
            continue
        content = m.flat_content()
        if calls:
            blocks = CALL_SEPARATOR.join(render_call_block(c.function.name, c.function.arguments_text())
                                         for c in calls)
            content = f"{content}\n{blocks}" if content else blocks
        out.append({"role": _role(m), "content": content})
    for d in out:
        d.pop("_tool_results", None)
    if tools:
        section = default_tool_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{section}" if out[0]["content"] else section
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def render_chat(tokenizer: Any, messages: Sequence[ChatMessage], tools: Sequence[ToolDefinition] | None,
                *, add_generation_prompt: bool = True, template_kwargs: dict[str, Any] | None = None,
                chat_template: str | None = None, continue_final_message: bool = False) -> str:
    """The prompt text for `messages` (pydantic ChatMessage or ToolChatMessage) and `tools`.

    `tokenizer` is a transformers tokenizer with a chat template; `chat_template` overrides it.
    continue_final_message: the text ends inside the last message (no end-of-turn after it), so the
    reply continues it (transformers' apply_chat_template option of that name).
    Raises: whatever the template raises (jinja2.TemplateError and friends: the handler turns it into
    a 400 on `messages`); ValueError when there is no chat template.
    """
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("this model has no chat template")
    kwargs = dict(template_kwargs or {})
    if continue_final_message:
        kwargs["continue_final_message"] = True
    if template_supports_tools(template):
        tool_dicts = [t.template_dict() for t in tools] if tools else None
        return tokenizer.apply_chat_template(
            native_template_messages(messages), tools=tool_dicts, tokenize=False,
            add_generation_prompt=add_generation_prompt, chat_template=template, **kwargs)
    return tokenizer.apply_chat_template(
        default_template_messages(messages, tools), tokenize=False,
        add_generation_prompt=add_generation_prompt, chat_template=template, **kwargs)
