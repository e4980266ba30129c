"""Routes of the agent protocols translated onto the chat path: OpenAI Responses and Anthropic Messages.

`add_protocol_routes(app, ctx)` registers them (called by server.create_app); the response store of
/v1/responses lives here, one per app.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from .http_io import post_route
from .serving_context import ServingContext
from .serving_messages import count_tokens, create_message
from .serving_responses import ResponseStore, create_response, delete_response, get_response


def add_protocol_routes(app: FastAPI, ctx: ServingContext) -> None:
    """POST /v1/responses, GET / DELETE /v1/responses/{id}, POST /v1/messages, /v1/messages/count_tokens."""
    store = ResponseStore()

    @post_route(app, "/v1/responses")
    async def _responses(request: Request) -> Response:
        return await create_response(ctx, store, request)

    @app.get("/v1/responses/{response_id}")
    async def _get_response(response_id: str) -> Response:
        return get_response(store, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def _delete_response(response_id: str) -> Response:
        return delete_response(store, response_id)

    @post_route(app, "/v1/messages")
    async def _messages(request: Request) -> Response:
        return await create_message(ctx, request)

    @post_route(app, "/v1/messages/count_tokens")
    async def _count_tokens(request: Request) -> Response:
        return await count_tokens(ctx, request)
