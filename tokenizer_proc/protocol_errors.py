"""Errors of the translated protocols: chat parameter names mapped back, and Anthropic's error shape.

A request translated onto the chat path (Responses, Messages) can fail in chat code, whose errors
name chat parameters (`messages`, `max_tokens`, `response_format`); `renamed` puts the protocol's own
names back. Anthropic clients read `{"type": "error", "error": {"type": ..., "message": ...}}`
(`anthropic_error`), not OpenAI's `{"error": {...}}`; the status code is the same. `error_response`
picks the shape by the route's path, for the errors no handler of the route answers itself (401 of
the API-key check, 404 / 405 of the router, 500).
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from fastapi.responses import Response

from .errors import APIError

# Paths whose errors take Anthropic's shape: /v1/messages and every path under it.
ANTHROPIC_PATH_PREFIX = "/v1/messages"

# Anthropic's error types by HTTP status (its API reference, "Errors").
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def renamed(err: APIError, names: dict[str, str]) -> APIError:
    """`err` with its `param` (and a "param: ..." message prefix) renamed through `names`: the chat name
    of a parameter (its first dotted / indexed component) -> the protocol's. Others pass unchanged."""
    if err.param is None:
        return err
    head = err.param.split(".", 1)[0].split("[", 1)[0]
    new = names.get(head)
    if new is None:
        return err
    param = new + err.param[len(head):]
    message = param + err.message[len(err.param):] if err.message.startswith(err.param) else err.message
    out = APIError(err.status, message, param=param, code=err.code, type_=err.type)
    out.headers = err.headers
    return out


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """`{"type": "error", "error": {"type": <Anthropic type of status>, "message": message}}`."""
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}


_INDEX = re.compile(r"\[(\d+)\]")


def dotted(param: str) -> str:
    """OpenAI-style path -> Anthropic's: "messages[0].content[1]" -> "messages.0.content.1"."""
    return _INDEX.sub(r".\1", param)


def anthropic_error(err: APIError, headers: dict[str, str] | None = None) -> Response:
    """`err` as an Anthropic error response (same status; the parameter, if any, named in the message
    in Anthropic's dotted form, `messages.0.content`, also where chat code named it `messages[0]`)."""
    message = err.message
    if err.param:
        param = dotted(err.param)
        if message.startswith(err.param):
            message = param + message[len(err.param):]
        elif param not in message:
            message = f"{param}: {message}"
    return Response(orjson.dumps(anthropic_error_body(err.status, message)), status_code=err.status,
                    media_type="application/json", headers=err.headers if headers is None else headers)


def error_response(path: str, err: APIError) -> Response:
    """`err` (with its `headers`) in the error shape of the route at `path`: Anthropic's under
    ANTHROPIC_PATH_PREFIX, OpenAI's elsewhere."""
    if path == ANTHROPIC_PATH_PREFIX or path.startswith(ANTHROPIC_PATH_PREFIX + "/"):
        return anthropic_error(err, err.headers)
    return err.response(err.headers)
