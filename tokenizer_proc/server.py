"""The FastAPI app of the tokenizer process: routes, API-key check, and error handlers.

State lives in one ServingContext passed to `create_app` (no module-level app state).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from radixrt import __version__

from .errors import APIError, install_handlers
from .gateway_routes import add_gateway_routes
from .http_io import json_response, post_route
from .openapi_doc import install_openapi
from .protocol_errors import error_response
from .protocol_routes import add_protocol_routes
from .serving_chat import chat_completions
from .serving_completions import completions
from .serving_context import ServingContext
from .serving_generate import abort_request, generate

ASGIApp = Callable[[dict[str, Any], Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]],
                   Awaitable[None]]
_OPEN_PATHS = frozenset({"/health"})
# FastAPI's native OpenTelemetry instrumentation, off: it would look up the global OTel providers on
# every request (~20 us), and the front end's own metrics are Prometheus (GET /metrics).
_NO_TELEMETRY: dict[str, Any] = {"tracing": False, "metrics": False, "logs": False}


class ApiKeyMiddleware:
    """Require `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) on every HTTP route
    but /health (constant-time compare of the key; the scheme "Bearer" in any case, RFC 7235)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = api_key.encode()
        self.expected_x = api_key.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in _OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given, given_x = b"", b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                given = value
            elif name == b"x-api-key":
                given_x = value
        scheme, _, key = given.partition(b" ")
        ok_bearer = hmac.compare_digest(key, self.expected) & (scheme.lower() == b"bearer")
        if ok_bearer | hmac.compare_digest(given_x, self.expected_x):
            await self.app(scope, receive, send)
            return
        err = APIError(401, "invalid or missing API key (expected `Authorization: Bearer <key>` or "
                       "`x-api-key: <key>`)", code="invalid_api_key")
        err.headers = {"WWW-Authenticate": "Bearer"}
        await error_response(scope["path"], err)(scope, receive, send)


def _public_args(ctx: ServingContext) -> dict[str, Any]:
    d = ctx.args.to_dict()
    d["api_key"] = "***" if d.get("api_key") else None
    return d


def create_app(ctx: ServingContext, extra_routes: Callable[[FastAPI, ServingContext], None] | None = None,
               ) -> FastAPI:
    """Build the HTTP app over `ctx`. Starting the app starts the manager's receive loop."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        ctx.manager.start()
        yield

    app = FastAPI(title="radixrt", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json", telemetry=_NO_TELEMETRY)
    on_done = ctx.on_done
    install_handlers(app, on_unread=None if on_done is None else (lambda: on_done(None, "disconnected")),
                     respond=error_response)
    install_openapi(app)
    created = int(time.time())

    @post_route(app, "/v1/chat/completions")
    async def _chat(request: Request) -> Response:
        return await chat_completions(ctx, request)

    @post_route(app, "/generate")
    async def _generate(request: Request) -> Response:
        return await generate(ctx, request)

    @post_route(app, "/abort_request")
    async def _abort_request(request: Request) -> Response:
        return await abort_request(ctx, request)

    @post_route(app, "/v1/completions")
    async def _completions(request: Request) -> Response:
        return await completions(ctx, request)

    def model_card() -> dict[str, Any]:
        return {"id": ctx.served_model, "object": "model", "created": created, "owned_by": "radixrt",
                "root": ctx.served_model, "max_model_len": ctx.context_length}

    @app.get("/v1/models")
    async def _models() -> Response:
        return json_response({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model_id:path}")
    async def _model(model_id: str) -> Response:
        if model_id != ctx.served_model:
            raise APIError(404, f"The model `{model_id}` does not exist. This server serves: "
                           f"{ctx.served_model}.", param="model", code="model_not_found")
        return json_response(model_card())

    add_protocol_routes(app, ctx)
    _add_control_routes(app, ctx)
    add_gateway_routes(app, ctx, _control)
    if extra_routes is not None:
        extra_routes(app, ctx)
    if ctx.args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=ctx.args.api_key)
    return app


def _add_control_routes(app: FastAPI, ctx: ServingContext) -> None:
    """/health, /get_server_info (+ /server_info), /flush_cache: answered by the scheduler (ControlReq)."""

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def _health() -> Response:
        await _control(ctx, "health")
        return Response(status_code=200)

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def _server_info() -> Response:
        data = await _control(ctx, "get_server_info")
        data.pop("server_args", None)  # ours below, with the API key masked
        worker, sched = data.get("worker", {}), data.get("scheduler", {})
        resolved = {k: v for k, v in (("device", worker.get("device")), ("dtype", worker.get("dtype")),
                                      ("attention_backend", worker.get("attention_backend")),
                                      ("chunked_prefill_size", sched.get("chunked_prefill_size")),
                                      ("max_total_tokens", worker.get("pool_tokens")),
                                      ("quantization", worker.get("quantization")))
                    if v is not None}  # the values in effect, where the flag said "auto" or nothing
        return json_response({**_public_args(ctx), **resolved, "served_model_name": ctx.served_model,
                              "context_length": ctx.context_length, "version": __version__, **data})

    @app.post("/flush_cache")
    async def _flush(request: Request) -> Response:
        data = await _control(ctx, "flush_cache")
        return json_response({"ok": True, **data})

    @app.get("/flush_cache")
    async def _flush_get(request: Request) -> Response:
        return await _flush(request)


async def _control(ctx: ServingContext, kind: str) -> dict[str, Any]:
    """Ask the scheduler; 503 when it does not answer within --control-timeout s or says no."""
    if ctx.manager.closing:
        raise APIError(503, "server is shutting down")
    try:
        resp = await ctx.manager.control(kind, timeout_s=ctx.args.control_timeout)
    except TimeoutError:
        raise APIError(503, f"scheduler did not answer {kind} within {ctx.args.control_timeout:g} s "
                       "(--control-timeout)") from None
    if not resp.ok:
        msg = str(resp.data.get("error") or resp.data.get("message") or f"{kind} failed")
        raise APIError(400 if kind == "flush_cache" else 503, msg)
    return resp.data

