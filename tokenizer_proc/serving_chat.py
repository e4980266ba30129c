"""POST /v1/chat/completions: chat template, sampling, and the two response shapes (JSON and SSE)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from .errors import bad_request
from .logprobs import chat_logprobs
from .openai_protocol import ChatCompletionRequest
from .request_state import RequestHandle, SampleEvent
from .serving_common import (
    SSE_DONE,
    ChunkEncoder,
    ServingContext,
    build_sampling,
    check_model,
    check_prompt,
    collect,
    guard_stream,
    json_response,
    make_specs,
    new_handle,
    now_s,
    open_stream,
    parse_body,
    read_json,
    sse,
    tokenize,
    until_disconnect,
    usage,
    usage_of,
)


def _template_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    for m in req.messages:
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.flat_content()}
        if m.name is not None:
            d["name"] = m.name
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


async def chat_prompt_ids(ctx: ServingContext, req: ChatCompletionRequest) -> list[int]:
    """Render the chat template (with the generation prompt) and tokenize it.

    Raises:
        APIError: 400 when the model has no chat template or the template rejects the messages.
    """
    if not getattr(ctx.tokenizer, "chat_template", None):
        raise bad_request("this model has no chat template; use /v1/completions", param="messages")
    kwargs = dict(req.chat_template_kwargs or {})
    try:
        text = ctx.tokenizer.apply_chat_template(
            _template_messages(req), tokenize=False,
            add_generation_prompt=req.add_generation_prompt is not False, **kwargs)
    except Exception as e:  # jinja2 TemplateError and friends: the messages do not fit the template
        raise bad_request(f"the chat template rejected the messages: {e}", param="messages") from None
    return await tokenize(ctx, text)


async def chat_completions(ctx: ServingContext, request: Request) -> Response:
    body = parse_body(ChatCompletionRequest, await read_json(request, ctx.args.max_request_body_bytes))
    check_model(ctx, body.model)
    ids = await chat_prompt_ids(ctx, body)
    check_prompt(ctx, ids)
    max_new = body.max_new_tokens()
    sampling = build_sampling(body, max_new, ctx)
    n = body.n or 1
    specs = make_specs([ids], n, sampling, body.stop_list(), body.skip_special_tokens is not False)
    handle = new_handle(ctx, specs, stream=bool(body.stream), return_logprob=bool(body.logprobs),
                        top_logprobs_num=body.top_logprobs or 0)
    meta = {"id": f"chatcmpl-{handle.id}", "created": now_s(), "model": ctx.served_model}
    if body.stream:
        events = await open_stream(handle)
        gen = _stream(ctx, body, handle, events, meta)
        return StreamingResponse(guard_stream(gen), media_type="text/event-stream")
    choices = await until_disconnect(request, collect(handle))
    out = [{"index": i, "message": {"role": "assistant", "content": c.text},
            "logprobs": {"content": chat_logprobs(ctx.texts, c.logprobs)} if body.logprobs else None,
            "finish_reason": c.finish_reason, "matched_stop": c.matched_stop}
           for i, c in sorted(choices.items())]
    return json_response({**meta, "object": "chat.completion", "choices": out,
                          "usage": usage_of(choices, n)})


async def _stream(ctx: ServingContext, body: ChatCompletionRequest, handle: RequestHandle,
                  batches: AsyncIterator[list[SampleEvent]], meta: dict[str, Any]) -> AsyncIterator[bytes]:
    """SSE chunks: a role delta per choice, content deltas, a finish chunk per choice, usage, [DONE].

    One bytes object (one socket write) per wake-up, as in serving_completions._stream.
    """
    with_usage = body.include_usage()
    base = {**meta, "object": "chat.completion.chunk"}
    extra = {"usage": None} if with_usage else {}
    enc = ChunkEncoder(base, extra)

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, lps: Any = None) -> bytes:
        return enc({"index": index, "delta": delta, "logprobs": lps, "finish_reason": finish})

    def tail() -> list[bytes]:
        out = []
        if with_usage:
            u = usage_of(last, body.n or 1) if last else usage(0, 0, 0)
            out.append(sse({**base, "choices": [], "usage": u}))
        out.append(SSE_DONE)
        return out

    last: dict[int, SampleEvent] = {}
    try:
        yield b"".join(chunk(st.spec.index, {"role": "assistant", "content": ""})
                       for st in sorted(handle.samples.values(), key=lambda s: s.spec.index))
        done = False
        async for batch in batches:
            parts = []
            for ev in batch:
                last[ev.index] = ev
                if ev.text or ev.logprobs:
                    lps = {"content": chat_logprobs(ctx.texts, ev.logprobs)} if body.logprobs else None
                    parts.append(chunk(ev.index, {"content": ev.text}, None, lps))
                if ev.finish_reason is not None:
                    parts.append(chunk(ev.index, {}, ev.finish_reason))
            if handle.all_finished:
                parts.extend(tail())
                done = True
            if parts:
                yield parts[0] if len(parts) == 1 else b"".join(parts)
        if not done:
            yield b"".join(tail())
    finally:
        handle.finish(sys.exc_info()[1])
