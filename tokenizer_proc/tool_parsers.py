"""Tool-call parsers by `--tool-call-parser` name, and the choice of one from a chat template.

Usage in the chat handler (one parser per request, one stream per choice):

    parser = get_tool_parser(args.tool_call_parser or detect_tool_parser(template) or "hermes")
    out = parser.parse(text)                  # non-streaming: out.content, out.tool_calls
    s = parser.stream(); d = s.feed(delta)    # streaming: d.content, d.tool_calls; then s.finish()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .tool_parser_base import (
    CallsOnly,
    ParsedOutput,
    StreamDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStream,
    ToolParser,
    new_call_id,
)
from .tool_parser_formats import HermesParser, Llama3JsonParser, PythonicParser

if TYPE_CHECKING:  # tool_grammar imports radixrt.constrained (torch); the launcher imports this module
    from .tool_grammar import ToolPlan

__all__ = [
    "TOOL_PARSERS", "ParsedOutput", "StreamDelta", "ToolCall", "ToolCallDelta", "ToolCallStream",
    "ToolParser", "assistant_message", "detect_tool_parser", "finish_reason_with_tools",
    "get_tool_parser", "new_call_id", "plan_parser",
]

# --tool-call-parser names; aliases follow the names SGLang and vLLM users already type.
TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    "qwen": HermesParser,
    "qwen25": HermesParser,
    "llama3_json": Llama3JsonParser,
    "llama3": Llama3JsonParser,
    "pythonic": PythonicParser,
}


def get_tool_parser(name: str, new_id: Callable[[], str] = new_call_id) -> ToolParser:
    """The parser registered as `name`.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    cls = TOOL_PARSERS.get(name)
    if cls is None:
        raise ValueError(f"--tool-call-parser: unknown parser {name!r}; known: {', '.join(TOOL_PARSERS)}")
    return cls(new_id)


def plan_parser(plan: ToolPlan) -> ToolParser | None:
    """The parser that reads a request's output under its ToolPlan: None for plain content, the
    plan's format, wrapped in CallsOnly when the plan's grammar forces calls."""
    if not plan.parser:
        return None
    parser = get_tool_parser(plan.parser)
    return CallsOnly(parser) if plan.forced else parser


def detect_tool_parser(chat_template: str | None) -> str | None:
    """Guess the parser from the markers a chat template's tool section uses; None when it has none
    (the caller then uses the default tool prompt and "hermes")."""
    if not chat_template:
        return None
    if "<tool_call>" in chat_template:
        return "hermes"
    if "func_name1(" in chat_template or "[func_name(" in chat_template:
        return "pythonic"
    if "<|python_tag|>" in chat_template or '"parameters"' in chat_template:
        return "llama3_json"
    return None


def finish_reason_with_tools(finish_reason: str | None, num_calls: int) -> str | None:
    """OpenAI reports "tool_calls" when a choice that stopped naturally made calls; "length" stays."""
    return "tool_calls" if num_calls and finish_reason == "stop" else finish_reason


def assistant_message(out: ParsedOutput) -> dict[str, object]:
    """The `choices[i].message` of a chat completion: content None when it is only calls."""
    msg: dict[str, object] = {"role": "assistant",
                              "content": out.content if out.content or not out.tool_calls else None}
    if out.tool_calls:
        msg["tool_calls"] = [c.to_openai() for c in out.tool_calls]
    return msg
