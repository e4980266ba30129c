"""The `message` objects of POST /v1/messages and their SSE event sequence (a ResponseWriter).

Content blocks, in output order: `thinking` (with a --reasoning-parser), `text`, `tool_use` (one per
call, `input` the parsed arguments; `{}` when they are not a JSON object, e.g. cut by max_tokens). A
whole (non-streamed) message is built by the same steps from the whole output, so its blocks and their
order are the stream's. A stream, each event framed as `event: <type>` + `data: <json>`:

    message_start (usage: input tokens and cache reads known, output_tokens 0)
    per block: content_block_start, content_block_delta... (thinking_delta / text_delta /
               input_json_delta), content_block_stop
    message_delta (stop_reason, stop_sequence, usage), message_stop

Usage follows Anthropic's split of the prompt: `input_tokens` are the prompt tokens not served from
the cache, `cache_read_input_tokens` the radix-cache hits, `cache_creation_input_tokens` 0 (the
radix cache needs no explicit write).
"""

from __future__ import annotations

from typing import Any

from .assistant_output import AssistantStream, Piece
from .errors import APIError
from .json_limits import loads_bounded
from .protocol_errors import anthropic_error_body
from .reasoning_parser import ReasoningParser
from .request_state import SampleEvent
from .respond import Collected
from .sse import named_sse
from .tool_parser_base import ToolParser

_DELTA = {"thinking": ("thinking_delta", "thinking"), "text": ("text_delta", "text"),
          "tool_use": ("input_json_delta", "partial_json")}



def tool_use_id(call_id: str) -> str:
    """A tool call's id as Anthropic spells a tool_use block's: "toolu_" + the call's own digits."""
    return "toolu_" + call_id.removeprefix("call_")


def usage_object(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    """Anthropic usage: uncached input, cache reads (radix-cache hits), no cache writes, output."""
    return {"input_tokens": prompt - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": completion}


def stop_reason(finish_reason: str | None, matched_stop: Any, num_calls: int,
                stop: list[str]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): tool_use, max_tokens, stop_sequence (with the string) or end_turn."""
    if finish_reason == "length":
        return "max_tokens", None
    if num_calls:
        return "tool_use", None
    if isinstance(matched_stop, str) and matched_stop in stop:
        return "stop_sequence", matched_stop
    return "end_turn", None


def _input_object(arguments: str) -> Any:
    try:
        value = loads_bounded(arguments) if arguments else {}
    except ValueError:  # not JSON, or nested too deeply to serialize back
        return {}
    return value if isinstance(value, dict) else {}


class MessagesWriter:
    """Messages bodies and events for one request (n = 1). `meta`: id and model; `stop`: the
    request's stop_sequences (to tell a stop sequence from EOS)."""

    def __init__(self, meta: dict[str, Any], stop: list[str], reasoning: ReasoningParser | None,
                 tools: ToolParser | None) -> None:
        self.meta = {**meta, "type": "message", "role": "assistant"}
        self.stop, self.reasoning, self.tools = stop, reasoning, tools
        self.stream = AssistantStream.of(reasoning, tools)
        self.started = False
        self.num_blocks = 0
        self.open: str | None = None  # kind of the block being streamed
        self.blocks: list[dict[str, Any]] = []  # the blocks so far, as a whole message holds them
        self.arguments: dict[int, str] = {}  # a tool_use block's index -> its input JSON text so far

    def body(self, choices: dict[int, Collected]) -> dict[str, Any]:
        """The whole message: the blocks a stream of the same output builds (the same pieces through
        the same steps, its events dropped), so the two agree on blocks and their order."""
        c = choices[0]
        reason, seq = self._finish(self.stream.feed(c.text) + self.stream.finish(), c, [])
        for i, text in self.arguments.items():
            self.blocks[i]["input"] = _input_object(text)
        return {**self.meta, "content": self.blocks, "stop_reason": reason, "stop_sequence": seq,
                "usage": usage_object(c.prompt_tokens, c.completion_tokens, c.cached_tokens)}

    def head(self) -> list[bytes]:
        return []  # message_start waits for the first event, which carries the prompt's token counts

    def _emit(self, parts: list[bytes], kind: str, **fields: Any) -> None:
        parts.append(named_sse(kind, {"type": kind, **fields}))

    def _close(self, parts: list[bytes]) -> None:
        if self.open is not None:
            self._emit(parts, "content_block_stop", index=self.num_blocks - 1)
            self.open = None

    def _start(self, parts: list[bytes], kind: str, block: dict[str, Any]) -> None:
        self._close(parts)
        self._emit(parts, "content_block_start", index=self.num_blocks, content_block=block)
        self.blocks.append(dict(block))
        if kind == "tool_use":
            self.arguments[self.num_blocks] = ""
        self.num_blocks += 1
        self.open = kind

    def _piece(self, p: Piece, parts: list[bytes]) -> None:
        kind = {"reasoning": "thinking", "text": "text", "call": "tool_use"}[p.kind]
        if p.call is not None and p.call.id is not None:
            block = {"type": "tool_use", "id": tool_use_id(p.call.id), "name": p.call.name, "input": {}}
            self._start(parts, kind, block)
        elif self.open != kind:
            if kind == "text" and not p.text.strip():
                return  # whitespace between blocks is layout, not a text block
            after_call = self.open == "tool_use"
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {
                "type": "text", "text": ""}
            self._start(parts, kind, block)
            if kind == "text" and after_call:  # the gap after a call: chat's word boundary, a margin here
                p = Piece("text", p.text.lstrip())
        delta = p.call.arguments if p.call is not None else p.text
        if delta:
            dtype, key = _DELTA[kind]
            self._emit(parts, "content_block_delta", index=self.num_blocks - 1,
                       delta={"type": dtype, key: delta})
            if kind == "tool_use":
                self.arguments[self.num_blocks - 1] += delta
            else:
                self.blocks[-1][key] += delta

    def event(self, ev: SampleEvent, parts: list[bytes]) -> None:
        if not self.started:
            self.started = True
            start = {**self.meta, "content": [], "stop_reason": None, "stop_sequence": None,
                     "usage": usage_object(ev.prompt_tokens, 0, ev.cached_tokens)}
            self._emit(parts, "message_start", message=start)
        pieces = self.stream.feed(ev.text) if ev.text else []
        if ev.finish_reason is None:
            for p in pieces:
                self._piece(p, parts)
            return
        reason, seq = self._finish(pieces + self.stream.finish(), ev, parts)
        self._emit(parts, "message_delta", delta={"stop_reason": reason, "stop_sequence": seq},
                   usage=usage_object(ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens))
        self._emit(parts, "message_stop")

    def _finish(self, pieces: list[Piece], c: Collected | SampleEvent,
                parts: list[bytes]) -> tuple[str, str | None]:
        """The last pieces of the output, the last block closed; returns (stop_reason, stop_sequence)."""
        for p in pieces:
            self._piece(p, parts)
        if self.num_blocks == 0:  # an empty answer is still one (empty) text block
            self._start(parts, "text", {"type": "text", "text": ""})
        self._close(parts)
        return stop_reason(c.finish_reason, c.matched_stop, self.stream.num_calls, self.stop)

    def tail(self, last: dict[int, SampleEvent]) -> list[bytes]:
        return []  # message_stop went out with the last event

    def error_events(self, err: APIError) -> list[bytes]:
        """A mid-stream error: Anthropic's `error` event."""
        return [named_sse("error", anthropic_error_body(err.status, err.message))]
