"""A tiny OpenAI-compatible streaming server for benchmark tests (no model).

POST /v1/completions takes token-id prompts and streams one chunk per output token (optionally with
`token_ids`, or two tokens per chunk without them to provoke a count mismatch), then a usage chunk
when `stream_options.include_usage` is set. Output token t of a request is a function of the prompt,
so a resent history is reproducible. `cached_tokens` is the longest prefix shared with an earlier
prompt + answer, rounded down to 16-token pages, as a radix cache would report it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from bench.server_proc import free_port

MODEL = "fake-model"
PAGE = 16


@dataclass
class FakeOptions:
    token_ids: bool = True  # send choice.token_ids when the request asks return_token_ids
    two_tokens_per_chunk: bool = False  # and no token_ids: the stream count then disagrees with usage
    usage: bool = True  # honour stream_options.include_usage
    delay_s: float = 0.002  # between chunks
    fail_prompt_len: int | None = None  # prompts of this length get HTTP 400
    prompts: list[list[int]] = field(default_factory=list)  # every prompt received, in order
    in_flight: int = 0
    max_in_flight: int = 0  # most streams open at once
    seen: list[list[int]] = field(default_factory=list)  # prompt + answer of finished requests
    client_ports: list[int] = field(default_factory=list)  # the peer port of each completion request


def _cached_len(opts: FakeOptions, prompt: list[int]) -> int:
    best = 0
    for seq in opts.seen:
        n = 0
        for a, b in zip(seq, prompt, strict=False):
            if a != b:
                break
            n += 1
        best = max(best, n)
    return min(best, len(prompt) - 1) // PAGE * PAGE


def _chunk(text: str, ids: list[int] | None, finish: str | None) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    if ids is not None:
        choice["token_ids"] = ids
    obj = {"id": "cmpl-fake", "object": "text_completion", "model": MODEL, "choices": [choice]}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def _stream(opts: FakeOptions, body: dict, prompt: list[int]) -> AsyncIterator[bytes]:
    n_out = body["max_tokens"]
    cached = _cached_len(opts, prompt)
    answer = [1000 + (sum(prompt) + 7 * i) % 5000 for i in range(n_out)]
    step = 2 if opts.two_tokens_per_chunk else 1
    send_ids = opts.token_ids and body.get("return_token_ids") and not opts.two_tokens_per_chunk
    opts.in_flight += 1
    opts.max_in_flight = max(opts.max_in_flight, opts.in_flight)
    try:
        for i in range(0, n_out, step):
            await asyncio.sleep(opts.delay_s)
            ids = answer[i:i + step]
            finish = "length" if i + step >= n_out else None
            yield _chunk("".join(f" t{t}" for t in ids), ids if send_ids else None, finish)
    finally:
        opts.in_flight -= 1
    opts.seen.append(prompt + answer)
    if opts.usage and (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": len(prompt), "completion_tokens": n_out,
                 "total_tokens": len(prompt) + n_out, "prompt_tokens_details": {"cached_tokens": cached}}
        yield b"data: " + orjson.dumps({"id": "cmpl-fake", "choices": [], "usage": usage}) + b"\n\n"
    yield b"data: [DONE]\n\n"


def make_app(opts: FakeOptions) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        opts.client_ports.append(request.client.port if request.client else -1)
        prompt = body["prompt"]
        if not body.get("ignore_eos") or not body.get("stream"):
            return JSONResponse({"error": {"message": "the benchmark must stream with ignore_eos"}}, 400)
        if len(prompt) == opts.fail_prompt_len:
            return JSONResponse({"error": {"message": f"prompt of {len(prompt)} tokens refused"}}, 400)
        opts.prompts.append(list(prompt))
        return StreamingResponse(_stream(opts, body, prompt), media_type="text/event-stream")

    return app


@contextmanager
def fake_server(opts: FakeOptions) -> Iterator[str]:
    """Serve make_app(opts) on a free loopback port in a thread; yields the base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(opts), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("fake server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
