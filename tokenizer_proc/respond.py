"""How an admitted request's events reach the client: collected into whole choices, or streamed.

`respond` is the one place that runs a RequestHandle. Not streamed, it collects every sample to the
end (aborting them if the client disconnects) and replies with the protocol's JSON body. Streamed, it
first waits for the first output, so that a rejection still gets its HTTP status, then drives the
protocol's writer over the event batches: one socket write per wake-up, the last one carrying the
stream's tail. A protocol supplies only a ResponseWriter: how whole choices become a body and how
events become chunks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from .http_io import json_response, until_disconnect
from .request_state import RequestHandle, SampleEvent, TokenLogprob
from .sse import guard_stream


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
        ClientGone: a non-streamed request's client disconnected.
    """
    if handle.stream:
        batches = await open_stream(handle)
        on_error = getattr(writer, "error_events", None)  # optional: a protocol's own error events
        return HandleStreamingResponse(handle, guard_stream(stream_events(handle, batches, writer), on_error))
    choices = await until_disconnect(request, collect(handle))
    return json_response(writer.body(choices))


async def collect(handle: RequestHandle) -> dict[int, Collected]:
    """Run a request to the end; choices by index. Raises APIError on a scheduler rejection."""
    out: dict[int, Collected] = {s.spec.index: Collected() for s in handle.samples.values()}
    async with handle:
        async for ev in handle.events():
            out[ev.index].add(ev)
    return out


async def open_stream(handle: RequestHandle) -> AsyncIterator[list[SampleEvent]]:
    """Submit `handle` and wait for its first events, so that a rejection still gets a proper HTTP status.

    Returns an iterator over all event batches (see RequestHandle.event_batches; the first one
    included). The caller must call `handle.finish(...)` when done with it (stream_events does, in
    `finally`).

    Raises:
        APIError: the scheduler rejected the request before producing output.
    """
    await handle.__aenter__()
    batches = handle.event_batches()
    try:
        first = await anext(batches)
    except StopAsyncIteration:
        first = None
    except BaseException as e:
        handle.finish(e)
        raise

    async def chain() -> AsyncIterator[list[SampleEvent]]:
        if first is not None:
            yield first
        async for batch in batches:
            yield batch

    return chain()


async def stream_events(handle: RequestHandle, batches: AsyncIterator[list[SampleEvent]],
                        writer: ResponseWriter) -> AsyncIterator[bytes]:
    """The SSE bytes of a stream: `writer`'s head, one write per event batch, then its tail.

    Each batch (all tokens that arrived since the last wake-up) becomes one bytes object, so one
    socket write; once every sample has finished, that write also carries the tail. Ends the handle
    (aborting unfinished samples) however the stream ends.
    """
    last: dict[int, SampleEvent] = {}
    try:
        for write in writer.head():
            yield write
        done = False
        async for batch in batches:
            parts: list[bytes] = []
            for ev in batch:
                last[ev.index] = ev
                writer.event(ev, parts)
            if handle.all_finished:
                parts.extend(writer.tail(last))
                done = True
            if parts:
                yield parts[0] if len(parts) == 1 else b"".join(parts)
        if not done:
            yield b"".join(writer.tail(last))
    except BaseException as e:  # GeneratorExit / CancelledError: the client left
        handle.finish(e)
        raise
    finally:
        handle.finish(None)  # no-op when already ended above


class HandleStreamingResponse(StreamingResponse):
    """The SSE response of one RequestHandle; it ends the handle however the response ends.

    The body generator's own `finally` is not enough: when the client disconnects, Starlette cancels
    the task that iterates the body, and where that task was waiting decides whether the generator
    ever runs again. Cancelled inside the generator (waiting for tokens) it ends the handle; cancelled
    while writing a chunk (the generator suspended at its `yield`), or before the generator's first
    step, the generator is dropped unfinished and its `finally` runs only when the garbage collector
    finalizes it, or never. This response ends the handle (recording its outcome once) as soon as
    Starlette returns, then closes the body generator.
    """

    def __init__(self, handle: RequestHandle, content: AsyncIterator[bytes]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.handle = handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        exc: BaseException | None = None
        try:
            await super().__call__(scope, receive, send)
        except BaseException as e:
            exc = e
            raise
        finally:
            self.handle.finish(exc)
            body = self.body_iterator
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                await aclose()
