"""tool_choice -> a grammar for the grammar engine (xgrammar structural tags), and the plan for a request.

"required" forces the output to be calls (one, or one or more when parallel_tool_calls) whose names
are tools' names and whose arguments match each tool's JSON schema, so even a 135M model emits valid
calls; a named choice forces exactly one call of that function (as vLLM and SGLang do: with
parallel_tool_calls a small model repeated the same call until max_tokens, 169 calls in 7.5 minutes
on the CPU in a user test of 2026-12-02). "auto" is free text parsed afterwards, except that when some
tool has `strict: true` the arguments are constrained once a call starts (a triggered structural tag).

The grammar is an xgrammar structural tag (JSON text, kind "structural_tag"): it embeds each tool's
JSON schema as is, so building it needs no xgrammar here, and the engine compiles it with
GrammarCompiler.compile_structural_tag. The forced text is exactly what tool_prompt.render_call_block
renders back into the history (hermes), so the agent loop's next prompt extends the cached one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from radixrt.constrained.errors import GrammarError
from radixrt.constrained.spec import dumps_checked
from radixrt.json_depth import MAX_JSON_DEPTH, TAG_LEVELS

from .errors import bad_request
from .tool_prompt import CALL_CLOSE, CALL_OPEN, CALL_SEPARATOR
from .tool_protocol import NamedToolChoice, ToolDefinition, ToolFields

_LOOSE_ARGUMENTS: dict[str, Any] = {"type": "object"}  # a non-strict tool's arguments under "auto"
# Whitespace between JSON tokens of the arguments, at most this many characters in a row: room for the
# usual `{"a": 1, "b": 2}` spacing, none for the endless indentation small models fall into.
MAX_JSON_WHITESPACE = 1


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """A grammar for the grammar engine: `kind` names the dialect, `text` is the grammar itself."""

    kind: Literal["structural_tag", "ebnf", "json_schema", "regex"]
    text: str


@dataclass(frozen=True, slots=True)
class _CallFormat:
    """How one call is written, as begin/end strings around its arguments (a JSON object)."""

    parser: str
    begin: str         # format string with {name}: the JSON-encoded function name
    end: str
    separator: str     # between parallel calls
    trigger: str       # the prefix of every call (for "auto" with strict tools)


_FORMATS = {
    "hermes": _CallFormat("hermes", CALL_OPEN + '{{"name": {name}, "arguments": ', "}" + CALL_CLOSE,
                          CALL_SEPARATOR, "<tool_call>"),
    "llama3_json": _CallFormat("llama3_json", '{{"name": {name}, "parameters": ', "}", "; ",
                               '{"name": '),
}
_FORMAT_OF_PARSER = {"hermes": "hermes", "qwen": "hermes", "qwen25": "hermes",
                     "llama3_json": "llama3_json", "llama3": "llama3_json"}


def _tag(fmt: _CallFormat, tool: ToolDefinition, schema: dict[str, Any]) -> dict[str, Any]:
    name = json.dumps(tool.function.name, ensure_ascii=False)
    content = {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": MAX_JSON_WHITESPACE}
    return {"type": "tag", "begin": fmt.begin.format(name=name), "content": content, "end": fmt.end}


def _forced(fmt: _CallFormat, tools: Sequence[ToolDefinition], parallel: bool) -> dict[str, Any]:
    tags = [_tag(fmt, t, t.schema()) for t in tools]
    if parallel:
        return {"type": "tags_with_separator", "tags": tags, "separator": fmt.separator,
                "at_least_one": True}
    return tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}


def _triggered(fmt: _CallFormat, tools: Sequence[ToolDefinition], parallel: bool) -> dict[str, Any]:
    tags = [_tag(fmt, t, t.schema() if t.function.strict else _LOOSE_ARGUMENTS) for t in tools]
    return {"type": "triggered_tags", "triggers": [fmt.trigger], "tags": tags,
            "stop_after_first": not parallel}


def tool_grammar(tools: Sequence[ToolDefinition], tool_choice: str | NamedToolChoice, parallel: bool,
                 parser: str = "hermes") -> tuple[GrammarSpec | None, str]:
    """The grammar for a tool_choice, and the parser that reads output made under it.

    tool_choice "none" or "auto" without strict tools: (None, parser). "required": calls of any tool
    (one, or one or more when `parallel`); named: exactly one call of that tool; "auto" with a strict
    tool: free text, calls constrained once they start. Formats: hermes (also for "qwen"),
    llama3_json. A parser without a grammar form (pythonic) gets the hermes grammar for forced
    choices, and so the hermes parser; "auto" stays unconstrained.

    Raises:
        ValueError: a named choice that is not in tools (ToolFields already rejects it).
    """
    fmt = _FORMATS.get(_FORMAT_OF_PARSER.get(parser, ""))
    if tool_choice == "none" or not tools:
        return None, parser
    if tool_choice == "auto":
        if fmt is None or not any(t.function.strict for t in tools):
            return None, parser
        body = _triggered(fmt, tools, parallel)
    else:
        fmt = fmt or _FORMATS["hermes"]
        chosen = list(tools)
        if isinstance(tool_choice, NamedToolChoice):
            chosen = [t for t in tools if t.function.name == tool_choice.function.name]
            if not chosen:
                raise ValueError(f"tool_choice: function {tool_choice.function.name!r} is not in tools")
            parallel = False  # one call of the named function
        body = _forced(fmt, chosen, parallel)
    # (each tool's parameters were held to MAX_JSON_DEPTH where the request was read: tool_protocol.py)
    text = dumps_checked({"type": "structural_tag", "format": body}, "tools", MAX_JSON_DEPTH + TAG_LEVELS,
                         ensure_ascii=False)
    return GrammarSpec("structural_tag", text), fmt.parser


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What the chat handler does with a request's tools.

    render_tools: the tools for the prompt (also for tool_choice "none", so that the prompt, and so the
        radix-cache prefix, does not change with tool_choice). parser: the --tool-call-parser name for
        the output, None when it is plain content. grammar: the grammar to sample under, or None.
        forced: the grammar forces calls, so the output's content is dropped (tool_parsers.plan_parser).
    """

    render_tools: list[ToolDefinition]
    parser: str | None
    grammar: GrammarSpec | None
    forced: bool = False  # the grammar admits only calls (tool_choice "required" or a named function)


def plan_tools(fields: ToolFields, parser: str) -> ToolPlan:
    """Plan a request from its validated tool fields and the server's parser name.

    Raises:
        APIError: 400 (param "tools") when the tools' grammar cannot be built (nested too deeply)."""
    tools = list(fields.tools or [])
    choice = fields.effective_tool_choice()
    if choice == "none" or not tools:
        return ToolPlan(tools, None, None)
    try:
        grammar, out_parser = tool_grammar(tools, choice, fields.allows_parallel(), parser)
    except GrammarError as e:  # a tool's parameters nested too deeply for a grammar
        raise bad_request(str(e), param="tools") from None
    return ToolPlan(tools, out_parser, grammar, forced=grammar is not None and choice != "auto")
