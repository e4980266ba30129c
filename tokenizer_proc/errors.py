"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` and the app's exception handlers.

Client mistakes are 400 (never FastAPI's default 422, never a 500); unknown model 404; oversized body
413; missing/wrong API key 401; past --request-timeout 408; overload 429; scheduler unreachable or
shutting down 503.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
}



class ClientGone(Exception):
    """The client closed the connection before the response was ready."""

RETRY_AFTER_S = "1"  # the Retry-After of a 429, seconds: the queue moves within a few decode steps


class APIError(Exception):
    """An error that becomes an OpenAI error body with HTTP status `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "invalid_request_error")
        # extra response headers (e.g. Connection: close); a 429 says when to retry (the OpenAI and
        # Anthropic clients wait that long before their retries)
        self.headers: dict[str, str] | None = {"Retry-After": RETRY_AFTER_S} if status == 429 else None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self, headers: dict[str, str] | None = None) -> Response:
        return Response(orjson.dumps(self.body()), status_code=self.status,
                        media_type="application/json", headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _loc_to_param(loc: tuple[Any, ...]) -> str | None:
    """("messages", 0, "content") -> "messages[0].content"; pydantic's union-branch tags are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and not re.search(r"[\[\]()]", part) and part not in ("str", "int"):
            out += ("." if out else "") + part
    return out or None


# "name: ..." or a path "messages[0].tool_call_id: ..." at the start of a validator's message
_PARAM_PREFIX = re.compile(r"^([a-z_][a-z_0-9]*(?:\[\d+\]|\.[a-z_][a-z_0-9]*)*): (.*)$", re.S)


def from_validation_error(err: ValidationError | RequestValidationError) -> APIError:
    """First pydantic error -> 400 naming the parameter (from its location, or a "param: ..." message)."""
    errors = err.errors()
    if not errors:
        return bad_request("invalid request")
    first = errors[0]
    param = _loc_to_param(tuple(p for p in first.get("loc", ()) if p != "body"))
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    m = _PARAM_PREFIX.match(msg)
    if m:
        param = param or m.group(1)
        msg = f"{m.group(1)}: {m.group(2)}" if not msg.startswith(param or "") else msg
    elif param:
        msg = f"{param}: {msg}"
    return bad_request(msg, param=param)


def from_sampling_error(err: ValueError) -> APIError:
    """SamplingParams' ValueError starts with the parameter name."""
    msg = str(err)
    return bad_request(msg, param=msg.split(" ", 1)[0] or None)


def from_scheduler_error(message: str) -> APIError:
    """A scheduler rejection (TokenOutBatch.errors[i]) -> APIError.

    Convention: a message may start with an HTTP status, e.g. "429 queue is full"; otherwise 400.
    """
    m = re.match(r"^(4\d\d|5\d\d)[ :]+(.*)$", message, re.S)
    if m:
        return APIError(int(m.group(1)), m.group(2))
    if "too many" in message.lower():  # the scheduler's queue limit (--max-queued-requests)
        return APIError(429, message)
    return bad_request(message)


def _openai_response(_path: str, err: APIError) -> Response:
    return err.response(err.headers)


def install_handlers(app: FastAPI, on_unread: Callable[[], None] | None = None,
                     respond: Callable[[str, APIError], Response] = _openai_response) -> None:
    """Route every error the app can raise to an error body: `respond(path, err)`, OpenAI's by default
    (the server passes protocol_errors.error_response, which answers Anthropic's routes in Anthropic's
    shape, a 404 or 405 under /v1/messages included).

    `on_unread` is called once per request whose client disconnected before the server had read its
    body (starlette's ClientDisconnect from http_io.read_json): no RequestHandle exists for it, so
    the front end's metrics record its outcome ("disconnected") here."""

    @app.exception_handler(APIError)
    async def _api_error(req: Request, exc: APIError) -> Response:
        return respond(req.scope["path"], exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(req: Request, exc: RequestValidationError) -> Response:
        return respond(req.scope["path"], from_validation_error(exc))

    @app.exception_handler(ValidationError)
    async def _pyd_validation(req: Request, exc: ValidationError) -> Response:
        return respond(req.scope["path"], from_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, exc: StarletteHTTPException) -> Response:
        status = exc.status_code
        msg = str(exc.detail) if exc.detail else "error"
        err = APIError(status, msg, type_=_TYPES.get(status, "invalid_request_error"))
        err.headers = exc.headers  # a 405's Allow
        return respond(req.scope["path"], err)

    @app.exception_handler(ClientGone)
    async def _gone(_req: Request, _exc: ClientGone) -> Response:
        # Not an error: the samples were already aborted; nobody reads this response.
        logger.info("client disconnected before the response; request aborted")
        return Response(status_code=499)

    @app.exception_handler(ClientDisconnect)
    async def _unread(_req: Request, _exc: ClientDisconnect) -> Response:
        # Not an error either: the client left before its request was read, so nothing was submitted
        # (uvicorn answers http.disconnect once the connection is gone, even for a buffered body).
        logger.info("client disconnected before its request was read")
        if on_unread is not None:
            on_unread()
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _internal(req: Request, exc: Exception) -> Response:
        logger.exception("internal error: %r", exc)
        return respond(req.scope["path"], APIError(500, "internal server error"))
