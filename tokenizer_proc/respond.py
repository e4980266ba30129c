"""How an admitted request's events reach the client: collected into whole choices, or streamed.

`respond` is the one place that runs a RequestHandle. Not streamed, it collects every sample to the
end (aborting them if the client disconnects) and replies with the protocol's JSON body. Streamed, it
first waits for the first output, so that a rejection still gets its HTTP status, then drives the
protocol's writer over the event batches: one socket write per wake-up, the last one carrying the
stream's tail. A protocol supplies only a ResponseWriter: how whole choices become a body and how
events become chunks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from .errors import APIError
from .http_io import CancelOnDisconnect, json_response, until_disconnect
from .request_state import RequestHandle, SampleEvent, TokenLogprob
from .sse import SSE_DONE, sse


@dataclass
class Collected:
    """One choice's output so far: a whole (non-streamed) choice once its sample has finished."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: Any = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    text_parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The text so far (the parts joined on each read)."""
        return "".join(self.text_parts)

    def add(self, ev: SampleEvent) -> None:
        """Append `ev`'s output; take its finish state and token counts (they are cumulative)."""
        self.text_parts.append(ev.text)
        self.token_ids.extend(ev.token_ids)
        self.logprobs.extend(ev.logprobs)
        self.finish_reason, self.matched_stop = ev.finish_reason, ev.matched_stop
        self.prompt_tokens, self.completion_tokens = ev.prompt_tokens, ev.completion_tokens
        self.cached_tokens = ev.cached_tokens


class ResponseWriter(Protocol):
    """The protocol-specific part of a response: bodies and chunks, nothing that drives the request."""

    def body(self, choices: dict[int, Collected]) -> Any:
        """The JSON body of a non-streamed response, from every choice by index."""
        ...

    def head(self) -> list[bytes]:
        """The stream's first writes, before any event (role deltas, echoed prompts); may be empty."""
        ...

    def event(self, ev: SampleEvent, parts: list[bytes]) -> None:
        """Append the SSE chunks of one event to `parts` (the current write)."""
        ...

    def tail(self, last: dict[int, SampleEvent]) -> list[bytes]:
        """The stream's end (usage chunk, [DONE]), given each choice's last event by index."""
        ...


async def respond(request: Request, handle: RequestHandle, writer: ResponseWriter) -> Response:
    """Run `handle` and answer: `writer`'s JSON body, or its SSE stream when `handle.stream`.

    Raises:
        APIError: the scheduler rejected the request (before a stream's first output).
        ClientGone: the client disconnected before a non-streamed reply or a stream's first output
            (the samples are aborted then, not after a prefill nobody reads).
    """
    if handle.stream:
        return HandleStreamingResponse(handle, await until_disconnect(request, open_stream(handle)), writer)
    choices = await until_disconnect(request, collect(handle))
    return json_response(writer.body(choices))


async def collect(handle: RequestHandle) -> dict[int, Collected]:
    """Run a request to the end; choices by index. Raises APIError on a scheduler rejection."""
    out: dict[int, Collected] = {s.spec.index: Collected() for s in handle.samples.values()}
    async with handle:
        async for ev in handle.events():
            out[ev.index].add(ev)
    return out


async def open_stream(handle: RequestHandle) -> list[SampleEvent] | None:
    """Submit `handle` and wait for its first events, so that a rejection still gets a proper HTTP status.

    Returns the first event batch (RequestHandle.next_batch; None if the samples finished without
    any). The caller must call `handle.finish(...)` when done with the handle
    (HandleStreamingResponse does).

    Raises:
        APIError: the scheduler rejected the request before producing output.
    """
    await handle.__aenter__()
    try:
        return await handle.next_batch()
    except BaseException as e:
        handle.finish(e)
        raise


class HandleStreamingResponse(Response):
    """The SSE response of one RequestHandle, written as its event batches arrive.

    Writes: the writer's head together with the first batch, then one write per later batch (all
    tokens that arrived since the last wake-up); the batch that finishes every sample goes out with
    the writer's tail as the last message of the body (one socket write that also ends the chunked
    body). An APIError after the first output ends the stream with an SSE error event and
    `data: [DONE]`, or with the writer's `error_events(err)` when it has that method (a protocol's
    own error framing).

    A client that disconnects cancels the writing (CancelOnDisconnect), wherever it waits: for
    tokens or on a full socket. However the response ends, it ends the handle once (aborting
    unfinished samples, recording the outcome) before returning.
    """

    media_type = "text/event-stream"

    def __init__(self, handle: RequestHandle, first: list[SampleEvent] | None,
                 writer: ResponseWriter) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(None)
        self.handle = handle
        self.first = first
        self.writer = writer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        exc: BaseException | None = None
        try:
            async with CancelOnDisconnect(receive):
                await send({"type": "http.response.start", "status": self.status_code,
                            "headers": self.raw_headers})
                await self._write_body(send)
            # The body is out. The streams that finished in the same scheduler pass (a burst ends in
            # one) are waiting to run: they write their last bytes before this one does its
            # bookkeeping (finish, and uvicorn's end of the request).
            await asyncio.sleep(0)
        except BaseException as e:
            exc = e
            raise
        finally:
            self.handle.finish(exc)  # after a disconnect: exc None, "aborted" unless every sample finished

    async def _write_body(self, send: Send) -> None:
        handle, writer = self.handle, self.writer
        last: dict[int, SampleEvent] = {}
        parts = list(writer.head())
        batch = self.first
        try:
            while batch is not None:
                for ev in batch:
                    last[ev.index] = ev
                    writer.event(ev, parts)
                if handle.all_finished:
                    break
                if parts:
                    await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
                    parts = []
                batch = await handle.next_batch()
        except APIError as e:
            handle.finish(e)
            on_error = getattr(writer, "error_events", None)
            parts = on_error(e) if on_error is not None else [sse(e.body()), SSE_DONE]
        else:
            parts.extend(writer.tail(last))
        await send({"type": "http.response.body", "body": b"".join(parts), "more_body": False})
