"""POST /v1/responses (and GET / DELETE of stored responses): the Responses API as a translation onto
the chat path, with a bounded in-memory store for `store` / `previous_response_id`.

The request becomes a ChatCompletionRequest (responses_protocol.to_chat_request) and runs through
serving_chat.serve_chat (same tool plan, grammar, template, Submission, admit and respond as chat
completions); only the ResponseWriter differs (responses_writer.ResponsesWriter).

Store: `store` defaults to true, as in OpenAI. The server keeps the last MAX_STORED_RESPONSES
completed responses for STORED_RESPONSE_TTL_S each (least recently stored dropped first), in memory
only (lost on restart). `previous_response_id` naming a response that is not (or no longer) stored
is a 400 on `previous_response_id`; a stored turn is replayed as chat history (its input and output
items, not its instructions, as in OpenAI). While a stored response is generated, GET answers its
`in_progress` object and DELETE drops it (then nothing is stored when it ends); one that fails or
whose client leaves is never stored.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from .errors import APIError, bad_request
from .http_io import json_response, read_json
from .openai_protocol import ChatCompletionRequest
from .protocol_errors import renamed
from .reasoning_parser import get_reasoning_parser
from .request_checks import check_model, parse_body
from .request_state import RequestHandle
from .responses_protocol import ResponsesRequest, input_messages, to_chat_request
from .responses_writer import ResponsesWriter, item_id
from .serving_chat import chat_prompt_ids, serve_chat, server_tool_parser
from .serving_context import ServingContext
from .tool_grammar import ToolPlan, plan_tools
from .tool_parsers import plan_parser

MAX_STORED_RESPONSES = 512
STORED_RESPONSE_TTL_S = 3600.0
PENDING_GRACE_S = 30.0  # an "ok" request whose writer never completed the body leaves GET this late
# chat parameter -> Responses parameter, for errors raised on the chat path
_PARAM_NAMES = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}


@dataclass(slots=True)
class StoredResponse:
    """A completed response and the chat history it ends (input + output, no instructions)."""

    body: dict[str, Any]
    messages: list[dict[str, Any]]
    expires_at: float  # on the store's clock (seconds)


class ResponseStore:
    """Bounded in-memory store of completed responses: at most `max_entries`, each for `ttl_s`.

    Owned by the app (one per create_app); used from the event loop only.
    """

    def __init__(self, max_entries: int = MAX_STORED_RESPONSES, ttl_s: float = STORED_RESPONSE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries, self.ttl_s, self.clock = max_entries, ttl_s, clock
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()
        # responses being generated (store=true): their `in_progress` body, for GET; DELETE drops the
        # entry, and then `finish` stores nothing (a delete during generation was undone; break-it 12-05)
        self.pending: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def begin(self, rid: str, body: dict[str, Any]) -> None:
        """`rid` is being generated; `body` is its `in_progress` response object."""
        self.pending[rid] = body
        while len(self.pending) > self.max_entries:
            self.pending.popitem(last=False)

    def finish(self, rid: str, body: dict[str, Any] | None, messages: list[dict[str, Any]]) -> None:
        """`rid` ended: store `body` if it is still pending (not deleted meanwhile); None: it failed or
        its client left, and nothing is stored."""
        if self.pending.pop(rid, None) is not None and body is not None:
            self.put(rid, body, messages)

    def ended(self, rid: str, outcome: str | None) -> None:
        """The request of `rid` ended with `outcome` (RequestHandle.outcome). Unless every sample
        finished ("ok": the writer completes the body right after, or already did) nothing will be
        stored, so the pending entry goes now; after "ok" it goes PENDING_GRACE_S later if the
        writer never completed it (the client left before the last bytes)."""
        if outcome != "ok":
            self.pending.pop(rid, None)
        elif rid in self.pending:
            asyncio.get_running_loop().call_later(PENDING_GRACE_S, self.pending.pop, rid, None)

    def in_progress(self, rid: str) -> dict[str, Any] | None:
        """The `in_progress` body of a response being generated, else None."""
        return self.pending.get(rid)

    def put(self, rid: str, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        """Store `body`; the oldest entries go once there are more than `max_entries`."""
        self.entries[rid] = StoredResponse(body, messages, self.clock() + self.ttl_s)
        self.entries.move_to_end(rid)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)

    def get(self, rid: str) -> StoredResponse | None:
        """The stored response, or None when unknown or expired (an expired one is dropped)."""
        entry = self.entries.get(rid)
        if entry is not None and entry.expires_at <= self.clock():
            del self.entries[rid]
            return None
        return entry

    def delete(self, rid: str) -> bool:
        """Drop `rid`, stored or being generated; False when it is neither."""
        return (self.entries.pop(rid, None) is not None) | (self.pending.pop(rid, None) is not None)


def _meta(req: ResponsesRequest, rid: str, model: str) -> dict[str, Any]:
    """The request fields a `response` object echoes."""
    fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else {
        "type": "text"}
    return {
        "id": rid, "model": model, "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id, "store": req.store is not False,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p, "text": {"format": fmt},
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": [{"type": "function", **t.model_dump(exclude={"type"})} for t in req.tools or []],
        "metadata": req.metadata or {}, "user": req.user, "truncation": req.truncation or "disabled",
        "reasoning": {"effort": None, "summary": None},
    }


def _history(store: ResponseStore, req: ResponsesRequest) -> list[dict[str, Any]]:
    if req.previous_response_id is None:
        return []
    prev = store.get(req.previous_response_id)
    if prev is None:
        raise bad_request(f"previous response {req.previous_response_id!r} is not stored here (this server "
                          f"keeps the last {store.max_entries} responses created with store=true for "
                          f"{store.ttl_s:.0f} s, in memory)", param="previous_response_id")
    return prev.messages


async def create_response(ctx: ServingContext, store: ResponseStore, request: Request) -> Response:
    """POST /v1/responses: validate, translate onto chat, serve through serve_chat with a ResponsesWriter.

    Raises:
        APIError: OpenAI-shaped 400 / 404 / 413 / 429 with Responses parameter names.
    """
    body = parse_body(ResponsesRequest, await read_json(request, ctx.args.max_request_body_bytes))
    err = body.unsupported()
    if err is not None:
        raise err
    check_model(ctx, body.model)
    history = _history(store, body)
    turn = input_messages(body.input, history)
    rid = item_id("resp")
    meta = _meta(body, rid, ctx.served_model)
    reasoning = get_reasoning_parser(getattr(ctx.args, "reasoning_parser", None))

    def on_complete(resp: dict[str, Any]) -> None:
        if body.store is not False:
            ok = resp["status"] in ("completed", "incomplete")
            store.finish(rid, resp if ok else None, history + turn + input_messages(resp["output"]))

    def count_tokens(text: str) -> int:
        return len(ctx.tokenizer.encode(text, add_special_tokens=False))

    def make_writer(_req: ChatCompletionRequest, handle: RequestHandle, plan: ToolPlan) -> ResponsesWriter:
        writer = ResponsesWriter(meta, reasoning, plan_parser(plan), count_tokens, on_complete)
        if body.store is not False:  # GET shows it in_progress; a client that leaves stores nothing
            store.begin(rid, writer.response("in_progress", [], None))
            handle.add_done_callback(lambda: store.ended(rid, handle.outcome))
        return writer

    try:
        chat = to_chat_request(body, history, turn)
        if body.truncation == "auto":
            chat = await _truncated(ctx, body, history + turn, chat)
        return await serve_chat(ctx, request, chat, make_writer)
    except APIError as e:
        raise renamed(e, _PARAM_NAMES) from None


async def _truncated(ctx: ServingContext, body: ResponsesRequest, conversation: list[dict[str, Any]],
                     chat: ChatCompletionRequest) -> ChatCompletionRequest:
    """`truncation: "auto"` (OpenAI's): while the rendered prompt leaves no room in the context, drop the
    conversation's oldest turn (a message and the non-user messages after it, so that a tool result
    never loses its call); the instructions stay. When only the last turn is left the request goes on
    as it is, and its prompt check answers the 400 (context_length_exceeded).

    The prompt is rendered once per try, so a long conversation cut by many turns pays several renders.
    """
    parser = server_tool_parser(ctx)
    while True:
        ids = await chat_prompt_ids(ctx, chat, plan_tools(chat, parser))
        if len(ids) < ctx.context_length:
            return chat
        cut = 1
        while cut < len(conversation) and conversation[cut].get("role") != "user":
            cut += 1
        if cut >= len(conversation):
            return chat
        conversation = conversation[cut:]
        chat = to_chat_request(body, [], conversation)


def get_response(store: ResponseStore, response_id: str) -> Response:
    """GET /v1/responses/{id}: the stored response object (`in_progress` while it is generated), or 404."""
    entry = store.get(response_id)
    if entry is None:
        pending = store.in_progress(response_id)
        if pending is None:
            raise APIError(404, f"response {response_id!r} is not stored here", param="response_id")
        return json_response(pending)
    return json_response(entry.body)


def delete_response(store: ResponseStore, response_id: str) -> Response:
    """DELETE /v1/responses/{id}: drop it from the store, or 404."""
    if not store.delete(response_id):
        raise APIError(404, f"response {response_id!r} is not stored here", param="response_id")
    return json_response({"id": response_id, "object": "response.deleted", "deleted": True})
