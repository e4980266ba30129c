"""POST /generate: the native (SGLang-style) API. Text or token ids in, text + meta_info out.

Non-streaming reply (one prompt): {"text", "output_ids", "meta_info": {id, prompt_tokens, completion_tokens,
cached_tokens, finish_reason, matched_stop[, output_token_logprobs, output_top_logprobs]}}; a batch
(list of texts / of id lists) gets a list of those. Streaming sends the same object after each
step with the *cumulative* text (as SGLang does), then `data: [DONE]`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import TypeAdapter, ValidationError

from radixrt.sampling_params import SamplingParams

from .errors import bad_request
from .openai_protocol import GenerateRequest
from .request_state import RequestHandle, TokenLogprob
from .serving_common import (
    SSE_DONE,
    Collected,
    ServingContext,
    check_prompt,
    check_prompt_shape,
    collect,
    guard_stream,
    json_response,
    make_specs,
    new_handle,
    open_stream,
    parse_body,
    read_json,
    sse,
    tokenize,
    until_disconnect,
)

_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
_SAMPLING_ADAPTER = TypeAdapter(SamplingParams)  # strict JSON-mode validation, then __post_init__


def generate_sampling(raw: dict[str, Any]) -> dict[str, Any]:
    """`sampling_params` -> SamplingParams dict; unknown keys and bad values are 400s naming the key."""
    for key in raw:
        if key not in _SAMPLING_FIELDS:
            raise bad_request(f"sampling_params.{key}: unknown sampling parameter",
                              param=f"sampling_params.{key}")
    params = dict(raw)
    if isinstance(params.get("stop"), str):
        params["stop"] = [params["stop"]]
    try:
        sp = _SAMPLING_ADAPTER.validate_json(orjson.dumps(params), strict=True)
    except ValidationError as e:
        first = e.errors()[0]
        msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        name = ".".join(str(p) for p in first.get("loc", ())) or msg.split(" ", 1)[0]
        raise bad_request(f"sampling_params.{name}: {msg}", param=f"sampling_params.{name}") from None
    return sp.to_dict()


async def _prompts(ctx: ServingContext, req: GenerateRequest) -> tuple[list[list[int]], bool]:
    """Token-id prompts and whether the request was a batch."""
    if req.text is not None:
        texts = req.text if isinstance(req.text, list) else [req.text]
        return [await tokenize(ctx, t) for t in texts], isinstance(req.text, list)
    ids = req.input_ids or []
    if ids and isinstance(ids[0], list):
        return [list(x) for x in ids], True  # type: ignore[arg-type]
    return [list(ids)], False  # type: ignore[arg-type]


def _lp_meta(ctx: ServingContext, lps: list[TokenLogprob]) -> dict[str, Any]:
    def txt(tid: int) -> str:
        return ctx.texts.get(tid)[0]
    return {"output_token_logprobs": [[lp.logprob, lp.token_id, txt(lp.token_id)] for lp in lps],
            "output_top_logprobs": [[[v, t, txt(t)] for t, v in lp.top] for lp in lps]}


def _result(ctx: ServingContext, handle: RequestHandle, index: int, c: Collected, want_lp: bool,
            text: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"id": f"{handle.id}-{index}", "prompt_tokens": c.prompt_tokens,
                            "completion_tokens": c.completion_tokens, "cached_tokens": c.cached_tokens,
                            "finish_reason": c.finish_reason, "matched_stop": c.matched_stop}
    if want_lp:
        meta.update(_lp_meta(ctx, c.logprobs))
    return {"text": c.text if text is None else text, "output_ids": c.token_ids, "meta_info": meta}


async def generate(ctx: ServingContext, request: Request) -> Response:
    raw = await read_json(request, ctx.args.max_request_body_bytes)
    if isinstance(raw, dict) and raw.get("input_ids") is not None:
        check_prompt_shape(raw["input_ids"], "input_ids", allow_text=False)
    body = parse_body(GenerateRequest, raw)
    sampling = generate_sampling(body.sampling_params)
    prompts, batch = await _prompts(ctx, body)
    for ids in prompts:
        check_prompt(ctx, ids, param="input_ids" if body.input_ids is not None else "text")
    specs = make_specs(prompts, 1, sampling, list(sampling["stop"]), True)
    want_lp = bool(body.return_logprob)
    handle = new_handle(ctx, specs, stream=bool(body.stream), return_logprob=want_lp,
                        top_logprobs_num=body.top_logprobs_num or 0)
    if body.stream:
        events = await open_stream(handle)
        return StreamingResponse(guard_stream(_stream(ctx, handle, events, want_lp)),
                                 media_type="text/event-stream")
    choices = await until_disconnect(request, collect(handle))
    results = [_result(ctx, handle, i, c, want_lp) for i, c in sorted(choices.items())]
    return json_response(results if batch else results[0])


async def _stream(ctx: ServingContext, handle: RequestHandle, batches: AsyncIterator[list[Any]],
                  want_lp: bool) -> AsyncIterator[bytes]:
    acc: dict[int, Collected] = {}
    texts: dict[int, list[str]] = {}
    try:
        async for batch in batches:
            parts = []
            for ev in batch:
                c = acc.setdefault(ev.index, Collected())
                texts.setdefault(ev.index, []).append(ev.text)
                c.token_ids.extend(ev.token_ids)
                c.logprobs.extend(ev.logprobs)
                c.finish_reason, c.matched_stop = ev.finish_reason, ev.matched_stop
                c.prompt_tokens, c.completion_tokens = ev.prompt_tokens, ev.completion_tokens
                c.cached_tokens = ev.cached_tokens
                out = _result(ctx, handle, ev.index, c, want_lp, text="".join(texts[ev.index]))
                parts.append(sse({"index": ev.index, **out}))
            if parts:
                yield b"".join(parts)
        yield SSE_DONE
    finally:
        handle.finish(sys.exc_info()[1])
