"""POST /v1/completions: prompts as text or token ids (one or several), echo, legacy logprobs, SSE."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from .detokenizer import decode
from .logprobs import CompletionLogprobs
from .openai_protocol import CompletionRequest
from .request_state import RequestHandle, SampleEvent
from .serving_common import (
    SSE_DONE,
    ChunkEncoder,
    ServingContext,
    build_sampling,
    check_model,
    check_prompt,
    check_prompt_shape,
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

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint


async def prompt_ids(ctx: ServingContext, req: CompletionRequest) -> list[list[int]]:
    """Normalize `prompt` (str | [str] | [int] | [[int]]) to token-id lists; each is checked."""
    p = req.prompt
    if isinstance(p, str):
        prompts = [await tokenize(ctx, p)]
    elif all(isinstance(x, str) for x in p):
        prompts = [await tokenize(ctx, x) for x in p]  # type: ignore[arg-type]
    elif all(isinstance(x, int) for x in p):
        prompts = [list(p)]  # type: ignore[arg-type]
    else:
        prompts = [list(x) for x in p]  # type: ignore[union-attr]
    for ids in prompts:
        check_prompt(ctx, ids, param="prompt")
    return prompts


async def completions(ctx: ServingContext, request: Request) -> Response:
    raw = await read_json(request, ctx.args.max_request_body_bytes)
    if isinstance(raw, dict) and "prompt" in raw:
        check_prompt_shape(raw["prompt"], "prompt")
    body = parse_body(CompletionRequest, raw)
    check_model(ctx, body.model)
    prompts = await prompt_ids(ctx, body)
    max_new = body.max_tokens if body.max_tokens is not None else DEFAULT_MAX_TOKENS
    sampling = build_sampling(body, max_new, ctx)
    n = body.n or 1
    specs = make_specs(prompts, n, sampling, body.stop_list(), body.skip_special_tokens is not False)
    want_lp = body.logprobs is not None
    handle = new_handle(ctx, specs, stream=bool(body.stream), return_logprob=want_lp,
                        top_logprobs_num=body.logprobs or 0)
    meta = {"id": f"cmpl-{handle.id}", "object": "text_completion", "created": now_s(),
            "model": ctx.served_model}
    if body.stream:
        events = await open_stream(handle)
        return StreamingResponse(guard_stream(_stream(ctx, body, handle, events, meta)),
                                 media_type="text/event-stream")
    choices = await until_disconnect(request, collect(handle))
    out = []
    for i, c in sorted(choices.items()):
        echo_text = _echo_text(ctx, body, handle, i)
        lp_obj: dict[str, Any] | None = None
        if want_lp:
            acc = CompletionLogprobs(ctx.texts)
            if body.echo:
                acc.add_prompt(_prompt_of(handle, i))
            acc.add(c.logprobs)
            lp_obj = acc.take()
        out.append({"index": i, "text": echo_text + c.text, "logprobs": lp_obj,
                    "finish_reason": c.finish_reason, "matched_stop": c.matched_stop,
                    **({"token_ids": c.token_ids} if body.return_token_ids else {})})
    return json_response({**meta, "choices": out, "usage": usage_of(choices, n)})


def _prompt_of(handle: RequestHandle, index: int) -> list[int]:
    for st in handle.samples.values():
        if st.spec.index == index:
            return st.spec.input_ids
    return []


def _echo_text(ctx: ServingContext, body: CompletionRequest, handle: RequestHandle, index: int) -> str:
    if not body.echo:
        return ""
    return decode(ctx.tokenizer, _prompt_of(handle, index), body.skip_special_tokens is not False)


def _tail(body: CompletionRequest, meta: dict[str, Any], extra: dict[str, Any],
          last: dict[int, SampleEvent]) -> list[bytes]:
    """The usage chunk (if asked) and [DONE]."""
    out = []
    if extra:
        u = usage_of(last, body.n or 1) if last else usage(0, 0, 0)
        out.append(sse({**meta, "choices": [], "usage": u}))
    out.append(SSE_DONE)
    return out


async def _stream(ctx: ServingContext, body: CompletionRequest, handle: RequestHandle,
                  batches: AsyncIterator[list[SampleEvent]], meta: dict[str, Any]) -> AsyncIterator[bytes]:
    """SSE chunks: (echo), text deltas, a finish chunk per choice, optional usage chunk, [DONE].

    One bytes object (one socket write) per wake-up: the events of all tokens that arrived since the
    last one; the last one also carries the usage chunk and [DONE].
    """
    want_lp = body.logprobs is not None
    want_ids = bool(body.return_token_ids)
    extra = {"usage": None} if body.include_usage() else {}
    enc = ChunkEncoder(meta, extra)
    accs: dict[int, CompletionLogprobs] = {}
    last: dict[int, SampleEvent] = {}

    def chunk(index: int, text: str, finish: str | None = None, lps: Any = None,
              ids: list[int] | None = None) -> bytes:
        choice = {"index": index, "text": text, "logprobs": lps, "finish_reason": finish}
        if want_ids:
            choice["token_ids"] = ids or []
        return enc(choice)

    try:
        for st in sorted(handle.samples.values(), key=lambda s: s.spec.index):
            i = st.spec.index
            accs[i] = CompletionLogprobs(ctx.texts)
            if body.echo:
                accs[i].add_prompt(st.spec.input_ids)
                yield chunk(i, _echo_text(ctx, body, handle, i), None, accs[i].take() if want_lp else None)
        done = False
        async for batch in batches:
            parts = []
            for ev in batch:
                last[ev.index] = ev
                if ev.text or ev.logprobs or (want_ids and ev.token_ids):
                    lps = None
                    if want_lp:
                        accs[ev.index].add(ev.logprobs)
                        lps = accs[ev.index].take()
                    parts.append(chunk(ev.index, ev.text, None, lps, ev.token_ids))
                if ev.finish_reason is not None:
                    parts.append(chunk(ev.index, "", ev.finish_reason))
            if handle.all_finished:  # the last write also carries the usage chunk and [DONE]
                parts.extend(_tail(body, meta, extra, last))
                done = True
            if parts:
                yield parts[0] if len(parts) == 1 else b"".join(parts)
        if not done:
            yield b"".join(_tail(body, meta, extra, last))
    finally:
        handle.finish(sys.exc_info()[1])
