"""The `response` objects of POST /v1/responses and their SSE event sequence (a ResponseWriter).

Output items, in output order: `reasoning` (with a --reasoning-parser), `message` (one `output_text`
part), `function_call` (one per call). A stream:

    response.created, response.in_progress,
    per item: response.output_item.added,
        reasoning: response.content_part.added, response.reasoning_text.delta..., .reasoning_text.done,
                   response.content_part.done
        message:   response.content_part.added, response.output_text.delta..., response.output_text.done,
                   response.content_part.done
        call:      response.function_call_arguments.delta..., response.function_call_arguments.done
    response.output_item.done; then response.completed (or response.incomplete, response.failed)

Every event carries `sequence_number` (0, 1, 2, ... within the stream) and is framed as
`event: <type>` + `data: <json>` with no `[DONE]`, as OpenAI sends it. A whole (non-streamed)
response is built by the same steps from the whole output, so its items, their order and statuses
are the stream's.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from .assistant_output import AssistantStream, Piece
from .errors import APIError
from .json_limits import loads_bounded
from .openai_response import now_s
from .reasoning_parser import ReasoningParser
from .request_state import SampleEvent
from .respond import Collected
from .sse import named_sse
from .tool_parser_base import ToolCall, ToolParser


def item_id(prefix: str) -> str:
    """A fresh output item id: `prefix` + "_" + 24 hex digits (msg_, fc_, rs_, resp_)."""
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def usage_object(prompt: int, completion: int, cached: int, reasoning: int) -> dict[str, Any]:
    """The Responses usage: input/output tokens, radix-cache hits as `input_tokens_details.cached_tokens`."""
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + completion}


def message_item(iid: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [] if status == "in_progress" else [_text_part(text)]
    return {"type": "message", "id": iid, "status": status, "role": "assistant", "content": content}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(iid: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [] if status == "in_progress" else [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": iid, "summary": [], "content": content, "status": status}


def call_item(iid: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": iid, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


class ResponsesWriter:
    """Responses bodies and events for one request (n = 1). `meta` holds the fields echoed from the
    request (id, model, instructions, tools, ...); `on_complete` receives the final response object
    (the store keeps it for previous_response_id). `count_tokens` turns reasoning text into
    `reasoning_tokens`."""

    def __init__(self, meta: dict[str, Any], reasoning: ReasoningParser | None, tools: ToolParser | None,
                 count_tokens: Callable[[str], int],
                 on_complete: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.meta = {"object": "response", "created_at": now_s(), **meta}
        self.reasoning, self.tools = reasoning, tools
        self.count_tokens, self.on_complete = count_tokens, on_complete
        self.seq = 0
        self.stream = AssistantStream.of(reasoning, tools)
        self.items: list[dict[str, Any]] = []  # finished output items
        self.open: dict[str, Any] | None = None  # the item being streamed: kind, id, text, call
        self.final: dict[str, Any] | None = None

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
                 finish_reason: str | None = None) -> dict[str, Any]:
        """The `response` object in `status`; a "length" finish makes it incomplete, "abort" failed."""
        body = {**self.meta, "status": status, "output": output, "usage": usage, "error": None,
                "incomplete_details": None}
        if finish_reason == "length":
            body["status"], body["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        elif finish_reason == "abort":
            body["status"] = "failed"
            body["error"] = {"code": "server_error", "message": "the request was aborted by the server"}
        return body

    def _usage(self, c: Collected | SampleEvent, reasoning_text: str) -> dict[str, Any]:
        rt = self.count_tokens(reasoning_text) if reasoning_text else 0
        rt = min(rt, c.completion_tokens)
        return usage_object(c.prompt_tokens, c.completion_tokens, c.cached_tokens, rt)

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.on_complete is not None:
            self.on_complete(body)
        return body

    def body(self, choices: dict[int, Collected]) -> dict[str, Any]:
        """The whole response: the items a stream of the same output builds (the same pieces through
        the same steps, its events dropped), so the two agree on items, order and statuses."""
        c = choices[0]
        self._finish(self.stream.feed(c.text) + self.stream.finish(), c, [])
        assert self.final is not None
        return self.final

    # ----- streaming -----
    def _emit(self, parts: list[bytes], kind: str, **fields: Any) -> None:
        parts.append(named_sse(kind, {"type": kind, "sequence_number": self.seq, **fields}))
        self.seq += 1

    def head(self) -> list[bytes]:
        parts: list[bytes] = []
        start = self.response("in_progress", [], None)
        self._emit(parts, "response.created", response=start)
        self._emit(parts, "response.in_progress", response=start)
        return [b"".join(parts)]

    def _open_item(self, parts: list[bytes], kind: str, call: Any = None) -> dict[str, Any]:
        index = len(self.items)
        if kind == "call":
            it = {"kind": kind, "id": item_id("fc"), "call": ToolCall(call.id, call.name or "", ""),
                  "text": ""}
            item = call_item(it["id"], call.id, call.name or "", "", "in_progress")
        else:
            it = {"kind": kind, "id": item_id("rs" if kind == "reasoning" else "msg"), "text": ""}
            item = (reasoning_item if kind == "reasoning" else message_item)(it["id"], "", "in_progress")
        self._emit(parts, "response.output_item.added", output_index=index, item=item)
        if kind != "call":
            part = {"type": "reasoning_text", "text": ""} if kind == "reasoning" else _text_part("")
            self._emit(parts, "response.content_part.added", item_id=it["id"], output_index=index,
                       content_index=0, part=part)
        self.open = it
        return it

    def _close_item(self, parts: list[bytes], status: str = "completed") -> None:
        it, self.open = self.open, None
        if it is None:
            return
        index, text = len(self.items), it["text"]
        loc = {"item_id": it["id"], "output_index": index}
        if it["kind"] == "call":
            call = it["call"]
            self._emit(parts, "response.function_call_arguments.done", **loc, name=call.name, arguments=text)
            item = call_item(it["id"], call.id, call.name, text, status)
        elif it["kind"] == "reasoning":
            self._emit(parts, "response.reasoning_text.done", **loc, content_index=0, text=text)
            self._emit(parts, "response.content_part.done", **loc, content_index=0,
                       part={"type": "reasoning_text", "text": text})
            item = reasoning_item(it["id"], text, status)
        else:
            self._emit(parts, "response.output_text.done", **loc, content_index=0, text=text, logprobs=[])
            self._emit(parts, "response.content_part.done", **loc, content_index=0, part=_text_part(text))
            item = message_item(it["id"], text, status)
        self._emit(parts, "response.output_item.done", output_index=index, item=item)
        self.items.append(item)

    def _piece(self, p: Piece, parts: list[bytes]) -> None:
        starts_call = p.kind == "call" and p.call is not None and p.call.id is not None
        it = self.open
        if it is None or it["kind"] != p.kind or starts_call:
            if p.kind == "text" and not p.text.strip() and (it is None or it["kind"] != "text"):
                return  # whitespace between items is layout, not a message
            after_call = it is not None and it["kind"] == "call"
            self._close_item(parts)
            it = self._open_item(parts, p.kind, p.call)
            if p.kind == "text" and after_call:  # the gap after a call: chat's word boundary, a margin here
                p = Piece("text", p.text.lstrip())
        loc = {"item_id": it["id"], "output_index": len(self.items)}
        delta = p.call.arguments if p.call is not None else p.text
        if not delta:
            return
        it["text"] += delta
        if p.kind == "call":
            self._emit(parts, "response.function_call_arguments.delta", **loc, delta=delta)
        elif p.kind == "reasoning":
            self._emit(parts, "response.reasoning_text.delta", **loc, content_index=0, delta=delta)
        else:
            self._emit(parts, "response.output_text.delta", **loc, content_index=0, delta=delta, logprobs=[])

    def event(self, ev: SampleEvent, parts: list[bytes]) -> None:
        pieces = self.stream.feed(ev.text) if ev.text else []
        if ev.finish_reason is None:
            for p in pieces:
                self._piece(p, parts)
            return
        self._finish(pieces + self.stream.finish(), ev, parts)

    def _finish(self, pieces: list[Piece], c: Collected | SampleEvent, parts: list[bytes]) -> None:
        """The last pieces of the output, then the items closed (the one a "length" finish cut marked
        incomplete, as OpenAI marks it) and the final response object in self.final."""
        for p in pieces:
            self._piece(p, parts)
        cut = "incomplete" if c.finish_reason == "length" else "completed"
        it = self.open
        if cut == "incomplete" and it is not None and it["kind"] == "call" and _is_object(it["text"]):
            # the call was whole; what the limit cut came after it (a next call's unfinished header,
            # which the parser drops): an agent must not skip this call as cut
            self._close_item(parts, "completed")
        self._close_item(parts, cut)
        if not self.items:  # an empty answer is still one (empty) message
            self._open_item(parts, "text")
            self._close_item(parts, cut)
        thought = "".join(i["content"][0]["text"] for i in self.items if i["type"] == "reasoning")
        self.final = self._complete(self.response("completed", self.items, self._usage(c, thought),
                                                  c.finish_reason))

    def tail(self, last: dict[int, SampleEvent]) -> list[bytes]:
        parts: list[bytes] = []
        final = self.final or self.response("failed", self.items, None, "abort")
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
            final["status"], "response.failed")
        self._emit(parts, kind, response=final)
        return parts

    def error_events(self, err: APIError) -> list[bytes]:
        """A mid-stream error: an `error` event, then `response.failed`, with the same code (the
        error's own, else its type for a 4xx, "server_error" for a 5xx)."""
        parts: list[bytes] = []
        code = err.code or (err.type if err.status < 500 else "server_error")
        self._emit(parts, "error", code=code, message=err.message, param=err.param)
        failed = self.response("failed", self.items, None)
        failed["error"] = {"code": code, "message": err.message}
        self._emit(parts, "response.failed", response=failed)
        return parts


def _is_object(arguments: str) -> bool:
    """Whether a call's arguments text is a whole JSON object."""
    try:
        return isinstance(loads_bounded(arguments), dict)
    except ValueError:
        return False
