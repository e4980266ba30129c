"""Server-sent-event framing: one event, the [DONE] marker, a fast chunk encoder."""

from __future__ import annotations

from typing import Any

import orjson

SSE_DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    """One server-sent event: `data: <json>\\n\\n`."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def named_sse(event: str, obj: Any) -> bytes:
    """One server-sent event with an event name (the Responses and Anthropic Messages framing):
    `event: <name>\ndata: <json>\n\n`."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


class ChunkEncoder:
    """SSE events `{**meta, "choices": [choice], **extra}` with the constant parts serialized once.

    `meta` and `extra` are fixed for a response (id, object, created, model; `"usage": null`), so each
    event costs one orjson.dumps of the choice. The bytes equal
    `sse({**meta, "choices": [choice], **extra})`.
    """

    __slots__ = ("head", "tail")

    def __init__(self, meta: dict[str, Any], extra: dict[str, Any]) -> None:
        self.head = b"data: " + orjson.dumps(meta)[:-1] + (b',"choices":[' if meta else b'"choices":[')
        self.tail = b"]" + (b"," + orjson.dumps(extra)[1:] if extra else b"}") + b"\n\n"

    def __call__(self, choice: dict[str, Any]) -> bytes:
        return self.head + orjson.dumps(choice) + self.tail
