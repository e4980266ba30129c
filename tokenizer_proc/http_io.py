"""HTTP plumbing of the handlers: their routes, the body read with a size cap, JSON replies, client
disconnects."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.types import Receive

from .errors import APIError, ClientGone, bad_request
from .json_limits import body_depth_error

T = TypeVar("T")
Endpoint = Callable[[Request], Awaitable[Response]]


class RequestRoute(APIRoute):
    """A route whose endpoint is called with the Request alone and returns the Response itself.

    The handlers of the generation routes read and validate their own bodies (read_json, a strict
    pydantic model) and build their own responses, so FastAPI's per-request work around an endpoint
    (solving its dependencies, reading the body, serializing a return value) would find nothing to
    do; this route skips it. It is still an APIRoute: it stays in the OpenAPI document (openapi_doc.py
    adds the request body), and errors reach the app's exception handlers as before.
    """

    def get_route_handler(self) -> Endpoint:
        return self.endpoint


def post_route(app: FastAPI, path: str) -> Callable[[Endpoint], Endpoint]:
    """`@post_route(app, path)`: like `@app.post(path)`, for an endpoint `async (Request) -> Response`
    (a RequestRoute)."""
    def register(endpoint: Endpoint) -> Endpoint:
        app.router.add_api_route(path, endpoint, methods=["POST"], route_class_override=RequestRoute)
        return endpoint
    return register


DRAIN_MAX_BYTES = 256 * 1024 * 1024  # an oversized body is read and dropped up to this, then cut
# A body whose next bytes do not come for this long is answered 408 and its connection closed (nginx's
# client_body_timeout default); a slow but steady body is read to the end (break-it, 2026-12-05: one
# that stopped arriving held its connection open indefinitely)
BODY_IDLE_TIMEOUT_S = 60.0


async def _receive_part(request: Request) -> tuple[bytes, bool]:
    """One body message from the ASGI channel: (bytes, more_body).

    Raises:
        ClientDisconnect: the client went away before the body ended.
    """
    msg = await request.receive()
    if msg["type"] != "http.request":
        raise ClientDisconnect()
    return msg.get("body", b""), bool(msg.get("more_body", False))


async def _too_large(request: Request, max_bytes: int, num_read: int, more: bool) -> APIError:
    """The 413 for an oversized body, after reading (and dropping) the rest of it.

    Answering while the client is still sending would close the socket with unread data, which the
    kernel answers with a TCP reset: the client then sees "connection reset" instead of the 413.
    So the rest is drained (in chunks, nothing kept) up to DRAIN_MAX_BYTES, and the connection is
    closed after the reply."""
    while more and num_read <= DRAIN_MAX_BYTES:
        part, more = await _receive_part(request)
        num_read += len(part)
    err = APIError(413, f"request body is larger than {max_bytes} bytes (--max-request-body-bytes)")
    err.headers = {"Connection": "close"}
    return err


async def read_json(request: Request, max_bytes: int) -> Any:
    """The request body as JSON, read with a size cap (straight from the ASGI channel, so that an
    oversized body can be drained after the cap whether or not it declared its length).

    Raises:
        APIError: 413 when larger than `max_bytes` (the client can read it: see _too_large); 408 when
            no bytes came for BODY_IDLE_TIMEOUT_S; 400 when empty, not valid JSON, or nested deeper than
            json_limits.MAX_BODY_DEPTH.
        ClientDisconnect: the client went away before the body ended.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise await _too_large(request, max_bytes, 0, True)
    buf, more = bytearray(), True
    while more:
        try:
            part, more = await asyncio.wait_for(_receive_part(request), BODY_IDLE_TIMEOUT_S)
        except TimeoutError:
            err = APIError(408, f"the request body stopped arriving: no bytes for {BODY_IDLE_TIMEOUT_S:g} s "
                           f"after {len(buf)}")
            err.headers = {"Connection": "close"}
            raise err from None
        buf += part
        if len(buf) > max_bytes:
            raise await _too_large(request, max_bytes, len(buf), more)
    if not buf:
        raise bad_request("request body is empty; expected a JSON object")
    raw = bytes(buf)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"request body is not valid JSON: {e}") from None
    too_deep = body_depth_error(body, raw)
    if too_deep:
        raise bad_request(too_deep)
    return body


def json_response(obj: Any, status: int = 200) -> Response:
    """`obj` serialized with orjson as an application/json response."""
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


class CancelOnDisconnect:
    """`async with CancelOnDisconnect(receive) as watch:` cancels the body when the client disconnects.

    While the block runs, one task waits for the ASGI `http.disconnect` and then cancels the task that
    entered the block; the block's exit takes that cancellation back (the task goes on, not
    cancelled) and sets `watch.client_gone`. A cancellation from anywhere else propagates as usual.
    Reading the request body must be over before the block starts (the watcher consumes `receive`).
    """

    __slots__ = ("_receive", "_task", "_watcher", "_cancelling", "client_gone")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._cancelling = 0
        self.client_gone = False

    async def __aenter__(self) -> CancelOnDisconnect:
        self._task = asyncio.current_task()
        assert self._task is not None, "CancelOnDisconnect needs a running task"
        self._cancelling = self._task.cancelling()
        self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return self

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.client_gone = True
        assert self._task is not None
        self._task.cancel()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        assert self._watcher is not None and self._task is not None
        self._watcher.cancel()  # before the next suspension: it cannot cancel the task after this
        if self.client_gone and self._task.uncancel() <= self._cancelling:
            return exc_type is asyncio.CancelledError  # our own cancellation: swallowed
        return False


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (which aborts its samples) if the client disconnects.

    Raises:
        ClientGone: the client went away first.
    """
    async with CancelOnDisconnect(request.receive) as watch:
        return await work
    assert watch.client_gone
    raise ClientGone()
