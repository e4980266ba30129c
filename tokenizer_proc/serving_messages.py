"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API as a translation onto
the chat path, answered in Anthropic's shapes (errors included).

The request becomes a ChatCompletionRequest (messages_protocol.to_chat_request) and runs through
serving_chat.serve_chat (same tool plan, grammar, template, Submission, admit and respond as chat
completions); only the ResponseWriter (messages_writer.MessagesWriter) and the error shape differ.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from .errors import APIError
from .http_io import json_response, read_json
from .messages_protocol import CountTokensRequest, MessagesRequest, to_chat_request
from .messages_writer import MessagesWriter
from .openai_protocol import ChatCompletionRequest
from .protocol_errors import anthropic_error, renamed
from .reasoning_parser import get_reasoning_parser
from .request_checks import check_model, parse_body
from .request_state import RequestHandle
from .serving_chat import chat_prompt_ids, serve_chat, server_tool_parser
from .serving_context import ServingContext
from .tool_grammar import ToolPlan, plan_tools
from .tool_parsers import plan_parser

# chat parameter -> Messages parameter, for errors raised on the chat path
_PARAM_NAMES = {"stop": "stop_sequences"}


async def _parse(ctx: ServingContext, request: Request, model: type[MessagesRequest]) -> MessagesRequest:
    body = parse_body(model, await read_json(request, ctx.args.max_request_body_bytes))
    check_model(ctx, body.model)
    return body


async def create_message(ctx: ServingContext, request: Request) -> Response:
    """POST /v1/messages. Every error is an Anthropic error body with its 4xx (or 5xx) status."""
    try:
        body = await _parse(ctx, request, MessagesRequest)
        chat = to_chat_request(body)
        reasoning = get_reasoning_parser(getattr(ctx.args, "reasoning_parser", None))
        meta: dict[str, Any] = {"id": f"msg_{uuid.uuid4().hex[:24]}", "model": ctx.served_model}

        def make_writer(_req: ChatCompletionRequest, _handle: RequestHandle,
                        plan: ToolPlan) -> MessagesWriter:
            tools = plan_parser(plan)
            return MessagesWriter(meta, body.stop_sequences or [], reasoning, tools)

        return await serve_chat(ctx, request, chat, make_writer)
    except APIError as e:
        return anthropic_error(renamed(e, _PARAM_NAMES))


async def count_tokens(ctx: ServingContext, request: Request) -> Response:
    """POST /v1/messages/count_tokens: `{"input_tokens": N}`, the prompt the same body would get."""
    try:
        body = await _parse(ctx, request, CountTokensRequest)
        chat = to_chat_request(body, stream=False)
        ids = await chat_prompt_ids(ctx, chat, plan_tools(chat, server_tool_parser(ctx)))
        return json_response({"input_tokens": len(ids)})
    except APIError as e:
        return anthropic_error(renamed(e, _PARAM_NAMES))
