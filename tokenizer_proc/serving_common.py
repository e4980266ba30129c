"""What the chat, completions and generate handlers share: body parsing, checks, sampling, SSE, usage."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from radixrt.config import ServerArgs
from radixrt.sampling_params import SamplingParams

from .errors import APIError, ClientGone, bad_request, from_sampling_error, from_validation_error
from .logprobs import TokenTexts
from .manager import TokenizerManager
from .openai_protocol import SamplingFields
from .request_state import RequestHandle, SampleEvent, SampleSpec

M = TypeVar("M", bound=BaseModel)
_OFFLOAD_CHARS = 32_768  # tokenize prompts longer than this in a thread, off the event loop


@dataclass
class ServingContext:
    """Everything a handler needs; built once by create_app."""

    manager: TokenizerManager
    tokenizer: Any
    args: ServerArgs
    served_model: str
    context_length: int
    on_done: Callable[[RequestHandle, str], None] | None = None
    texts: TokenTexts = field(init=False)
    vocab_size: int = field(init=False)

    def __post_init__(self) -> None:
        self.texts = TokenTexts(self.tokenizer)
        self.vocab_size = len(self.tokenizer)


async def read_json(request: Request, max_bytes: int) -> Any:
    """The request body as JSON, read with a size cap.

    Raises:
        APIError: 413 when larger than `max_bytes`; 400 when not valid JSON.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise APIError(413, f"request body is larger than {max_bytes} bytes")
    buf = bytearray()
    async for part in request.stream():
        buf += part
        if len(buf) > max_bytes:
            raise APIError(413, f"request body is larger than {max_bytes} bytes")
    if not buf:
        raise bad_request("request body is empty; expected a JSON object")
    try:
        return orjson.loads(bytes(buf))
    except orjson.JSONDecodeError as e:
        raise bad_request(f"request body is not valid JSON: {e}") from None


def parse_body(model: type[M], obj: Any) -> M:
    """Validate a decoded JSON body.

    Raises:
        APIError: 400 naming the offending parameter.
    """
    if not isinstance(obj, dict):
        raise bad_request("request body must be a JSON object")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise from_validation_error(e) from None


def _kind(x: Any) -> str:
    """A JSON value's kind, for messages: "a string", "a token id", "a list", "a float 1.5", ..."""
    if isinstance(x, bool):
        return f"the boolean {str(x).lower()}"
    if isinstance(x, int):
        return "an integer"
    if isinstance(x, str):
        return "a string"
    if isinstance(x, list):
        return "a list"
    if isinstance(x, float):
        return f"the number {x!r}"
    return "null" if x is None else "an object"


def _token_id_error(x: Any, where: str) -> str | None:
    if isinstance(x, int) and not isinstance(x, bool):
        return None if x >= 0 else f"{where}: token id {x} is negative"
    if isinstance(x, list):
        return (f"{where}: a list inside a token-id list; token ids nest at most two levels "
                "(a list of token-id lists)")
    return f"{where}: expected a token id (an integer >= 0), got {_kind(x)}"


def check_prompt_shape(value: Any, param: str, allow_text: bool = True) -> None:
    """Name the problem of a malformed prompt before generic validation does.

    Accepted shapes: a string, a non-empty list of strings, a non-empty list of token ids (integers
    >= 0), or a non-empty list of non-empty token-id lists (without text when `allow_text` is false).
    Token ids beyond the vocabulary are checked later (check_prompt).

    Raises:
        APIError: 400 with `param` set and the offending element named, e.g. `prompt[1][0]`.
    """
    what = ("a string, a list of strings, a list of token ids, or a list of token-id lists" if allow_text
            else "a list of token ids or a list of token-id lists")
    if isinstance(value, str) and allow_text:
        return
    if not isinstance(value, list):
        raise bad_request(f"{param} must be {what}; got {_kind(value)}", param=param)
    if not value:
        raise bad_request(f"{param} must not be an empty list", param=param)
    first = value[0]
    if isinstance(first, str) and allow_text:
        for i, x in enumerate(value):
            if not isinstance(x, str):
                raise bad_request(f"{param}[{i}]: expected a string like {param}[0] (a list of prompts "
                                  f"cannot mix text and token ids), got {_kind(x)}", param=param)
        return
    if isinstance(first, list):
        for i, x in enumerate(value):
            if not isinstance(x, list):
                raise bad_request(f"{param}[{i}]: expected a token-id list like {param}[0] (prompts cannot "
                                  f"mix token ids and token-id lists), got {_kind(x)}", param=param)
            if not x:
                raise bad_request(f"{param}[{i}]: empty token-id list", param=param)
            for j, t in enumerate(x):
                err = _token_id_error(t, f"{param}[{i}][{j}]")
                if err:
                    raise bad_request(err, param=param)
        return
    for i, x in enumerate(value):
        if isinstance(x, list) and i > 0:
            raise bad_request(f"{param}[{i}]: expected a token id like {param}[0] (prompts cannot mix "
                              "token ids and token-id lists), got a list", param=param)
        if isinstance(x, str):
            raise bad_request(f"{param}[{i}]: expected a token id, got a string "
                              f"({'a list of prompts cannot mix text and token ids' if allow_text else 'no text here'})",
                              param=param)
        err = _token_id_error(x, f"{param}[{i}]")
        if err:
            raise bad_request(err, param=param)


def check_model(ctx: ServingContext, name: str) -> None:
    if name != ctx.served_model:
        raise APIError(404, f"The model `{name}` does not exist. This server serves: {ctx.served_model}.",
                       param="model", code="model_not_found")


def check_prompt(ctx: ServingContext, ids: list[int], param: str = "messages") -> None:
    """Raises APIError 400 for an empty prompt, an unknown token id, or a prompt without room to generate."""
    if not ids:
        raise bad_request("the prompt is empty", param=param)
    if max(ids) >= ctx.vocab_size:
        raise bad_request(f"token id {max(ids)} is out of range (vocabulary size {ctx.vocab_size})",
                          param=param)
    if len(ids) >= ctx.context_length:
        raise bad_request(
            f"This model's maximum context length is {ctx.context_length} tokens. However, your prompt "
            f"has {len(ids)} tokens, which leaves no room for the completion.",
            param=param, code="context_length_exceeded")


async def tokenize(ctx: ServingContext, text: str) -> list[int]:
    """Encode text (special tokens in the text are parsed, no BOS/EOS added beyond the template's own)."""
    def run() -> list[int]:
        return list(ctx.tokenizer.encode(text, add_special_tokens=False))
    if len(text) > _OFFLOAD_CHARS:
        return await asyncio.to_thread(run)
    return run()


def build_sampling(req: SamplingFields, max_new_tokens: int | None, ctx: ServingContext) -> dict[str, Any]:
    """OpenAI fields -> SamplingParams dict (validated by SamplingParams too).

    Raises:
        APIError: 400 with `param` set.
    """
    for key in (req.logit_bias or {}):
        if int(key) >= ctx.vocab_size:
            raise bad_request(f"logit_bias: token id {key} is out of range", param="logit_bias")
    for tid in req.stop_token_ids or []:
        if tid >= ctx.vocab_size:
            raise bad_request(f"stop_token_ids: token id {tid} is out of range", param="stop_token_ids")
    values: dict[str, Any] = {
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "min_p": req.min_p,
        "frequency_penalty": req.frequency_penalty, "presence_penalty": req.presence_penalty,
        "repetition_penalty": req.repetition_penalty, "seed": req.seed,
        "logit_bias": req.logit_bias, "stop_token_ids": req.stop_token_ids,
    }
    kwargs = {k: v for k, v in values.items() if v is not None}
    kwargs["stop"] = req.stop_list()
    kwargs["ignore_eos"] = bool(req.ignore_eos)
    kwargs["max_new_tokens"] = max_new_tokens
    try:
        return SamplingParams(**kwargs).to_dict()
    except ValueError as e:
        raise from_sampling_error(e) from None


def make_specs(prompts: list[list[int]], n: int, sampling: dict[str, Any], stop: list[str],
               skip_special_tokens: bool) -> list[SampleSpec]:
    """Choice index = prompt_index * n + j (OpenAI's order for several prompts with n > 1).

    With a `seed` and n > 1, sample j gets seed + j: the n choices differ from each other, and the
    same request gives the same n choices again."""
    def sampling_of(j: int) -> dict[str, Any]:
        sp = dict(sampling)
        if sp.get("seed") is not None and n > 1:
            sp["seed"] = (int(sp["seed"]) + j) & 0x7FFFFFFF
        return sp

    return [SampleSpec(index=p * n + j, input_ids=ids, sampling=sampling_of(j), stop=stop,
                       skip_special_tokens=skip_special_tokens)
            for p, ids in enumerate(prompts) for j in range(n)]


def new_handle(ctx: ServingContext, specs: list[SampleSpec], *, stream: bool, return_logprob: bool = False,
               top_logprobs_num: int = 0) -> RequestHandle:
    """A handle for `specs`; 400 when they alone exceed what the server tracks at once, 429 when
    the server already tracks too many samples."""
    if ctx.manager.closing:
        raise APIError(503, "server is shutting down")
    if len(specs) > ctx.manager.max_inflight:  # could never be admitted: not worth a retry
        raise APIError(400, f"the request has {len(specs)} samples (prompts x n); this server takes at "
                       f"most {ctx.manager.max_inflight} at once (--max-running-requests + "
                       "--max-queued-requests)", param="n")
    if not ctx.manager.has_capacity(len(specs)):
        raise APIError(429, "too many requests in flight; retry later")
    return RequestHandle(ctx.manager, ctx.tokenizer, specs, stream=stream, return_logprob=return_logprob,
                         top_logprobs_num=top_logprobs_num, on_done=ctx.on_done)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def sse(obj: Any) -> bytes:
    """One server-sent event: `data: <json>\\n\\n`."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class ChunkEncoder:
    """SSE events `{**meta, "choices": [choice], **extra}` with the constant parts serialized once.

    `meta` and `extra` are fixed for a response (id, object, created, model; `"usage": null`), so each
    event costs one orjson.dumps of the choice. The bytes equal `sse({**meta, "choices": [choice], **extra})`.
    """

    __slots__ = ("head", "tail")

    def __init__(self, meta: dict[str, Any], extra: dict[str, Any]) -> None:
        self.head = b"data: " + orjson.dumps(meta)[:-1] + (b',"choices":[' if meta else b'"choices":[')
        self.tail = b"]" + (b"," + orjson.dumps(extra)[1:] if extra else b"}") + b"\n\n"

    def __call__(self, choice: dict[str, Any]) -> bytes:
        return self.head + orjson.dumps(choice) + self.tail


SSE_DONE = b"data: [DONE]\n\n"


def now_s() -> int:
    return int(time.time())


async def guard_stream(gen: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Turn an APIError raised mid-stream into an SSE error event followed by [DONE]."""
    try:
        async for item in gen:
            yield item
    except APIError as e:
        yield sse(e.body())
        yield SSE_DONE


@dataclass
class Collected:
    """A whole (non-streamed) choice."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: Any = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


async def collect(handle: RequestHandle) -> dict[int, Collected]:
    """Run a request to the end; choices by index. Raises APIError on a scheduler rejection."""
    out: dict[int, Collected] = {s.spec.index: Collected() for s in handle.samples.values()}
    parts: dict[int, list[str]] = {i: [] for i in out}
    async with handle:
        async for ev in handle.events():
            c = out[ev.index]
            parts[ev.index].append(ev.text)
            c.token_ids.extend(ev.token_ids)
            c.logprobs.extend(ev.logprobs)
            c.finish_reason, c.matched_stop = ev.finish_reason, ev.matched_stop
            c.prompt_tokens, c.completion_tokens = ev.prompt_tokens, ev.completion_tokens
            c.cached_tokens = ev.cached_tokens
    for i, c in out.items():
        c.text = "".join(parts[i])
    return out


def usage_of(choices: dict[int, Any], n: int) -> dict[str, Any]:
    """Usage over all choices: each prompt counted once (from its first choice), outputs summed."""
    prompt = sum(c.prompt_tokens for i, c in choices.items() if i % n == 0)
    cached = sum(c.cached_tokens for i, c in choices.items() if i % n == 0)
    completion = sum(c.completion_tokens for c in choices.values())
    return usage(prompt, completion, cached)


async def until_disconnect(request: Request, work: Any) -> Any:
    """Await coroutine `work`, cancelling it (which aborts its samples) if the client disconnects."""
    task = asyncio.ensure_future(work)

    async def wait_disconnect() -> None:
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        raise ClientGone()
    return task.result()


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


async def open_stream(handle: RequestHandle) -> AsyncIterator[list[SampleEvent]]:
    """Submit `handle` and wait for its first events, so that a rejection still gets a proper HTTP status.

    Returns an iterator over all event batches (see RequestHandle.event_batches; the first one
    included). The caller must call `handle.finish(...)` when done with it (the streaming generator
    does, in `finally`).

    Raises:
        APIError: the scheduler rejected the request before producing output.
    """
    await handle.__aenter__()
    batches = handle.event_batches()
    try:
        first = await anext(batches)
    except StopAsyncIteration:
        first = None
    except BaseException as e:
        handle.finish(e)
        raise

    async def chain() -> AsyncIterator[list[SampleEvent]]:
        if first is not None:
            yield first
        async for batch in batches:
            yield batch

    return chain()
