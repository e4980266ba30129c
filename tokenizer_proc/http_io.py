"""HTTP plumbing of the handlers: the body read with a size cap, JSON replies, client disconnects."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from .errors import APIError, ClientGone, bad_request

T = TypeVar("T")


DRAIN_MAX_BYTES = 256 * 1024 * 1024  # an oversized body is read and dropped up to this, then cut


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
        APIError: 413 when larger than `max_bytes` (the client can read it: see _too_large); 400 when
            empty or not valid JSON.
        ClientDisconnect: the client went away before the body ended.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise await _too_large(request, max_bytes, 0, True)
    buf, more = bytearray(), True
    while more:
        part, more = await _receive_part(request)
        buf += part
        if len(buf) > max_bytes:
            raise await _too_large(request, max_bytes, len(buf), more)
    if not buf:
        raise bad_request("request body is empty; expected a JSON object")
    try:
        return orjson.loads(bytes(buf))
    except orjson.JSONDecodeError as e:
        raise bad_request(f"request body is not valid JSON: {e}") from None


def json_response(obj: Any, status: int = 200) -> Response:
    """`obj` serialized with orjson as an application/json response."""
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (which aborts its samples) if the client disconnects.

    Raises:
        ClientGone: the client went away first.
    """
    task = asyncio.ensure_future(work)

    async def wait_disconnect() -> None:
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        raise ClientGone()
    return task.result()
