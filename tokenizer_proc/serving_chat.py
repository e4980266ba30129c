"""POST /v1/chat/completions: chat template, then the `chat.completion` body or its SSE chunks."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from .errors import bad_request
from .http_io import read_json
from .logprobs import chat_logprobs
from .openai_protocol import ChatCompletionRequest
from .openai_response import now_s, usage_of, usage_tail
from .request_checks import check_model, parse_body
from .request_state import RequestHandle, SampleEvent
from .respond import Collected, respond
from .serving_context import ServingContext
from .sse import ChunkEncoder
from .submission import admit, openai_submission, tokenize


def _template_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    for m in req.messages:
        role = "system" if m.role == "developer" else m.role
        d: dict[str, Any] = {"role": role, "content": m.flat_content()}
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
    """Validate, render the template, admit one prompt x n samples, answer as JSON or SSE."""
    body = parse_body(ChatCompletionRequest, await read_json(request, ctx.args.max_request_body_bytes))
    check_model(ctx, body.model)
    ids = await chat_prompt_ids(ctx, body)
    sub = openai_submission(ctx, body, [ids], prompt_param="messages", max_new_tokens=body.max_new_tokens(),
                            return_logprob=bool(body.logprobs), top_logprobs_num=body.top_logprobs or 0)
    handle = admit(ctx, sub)
    return await respond(request, handle, ChatWriter(ctx, body, handle))


class ChatWriter:
    """Chat bodies (a ResponseWriter): `chat.completion`, or SSE chunks of `chat.completion.chunk`.

    A stream: a role delta per choice, content deltas, a finish chunk per choice, the usage chunk
    (with `stream_options.include_usage`), [DONE].
    """

    def __init__(self, ctx: ServingContext, req: ChatCompletionRequest, handle: RequestHandle) -> None:
        self.ctx, self.req, self.handle = ctx, req, handle
        self.meta = {"id": f"chatcmpl-{handle.id}", "created": now_s(), "model": ctx.served_model}
        self.n = req.n or 1
        self.with_usage = req.include_usage()
        self.chunk_meta = {**self.meta, "object": "chat.completion.chunk"}
        self.enc = ChunkEncoder(self.chunk_meta, {"usage": None} if self.with_usage else {})

    def body(self, choices: dict[int, Collected]) -> dict[str, Any]:
        want_lp = bool(self.req.logprobs)
        out = [{"index": i, "message": {"role": "assistant", "content": c.text},
                "logprobs": {"content": chat_logprobs(self.ctx.texts, c.logprobs)} if want_lp else None,
                "finish_reason": c.finish_reason, "matched_stop": c.matched_stop}
               for i, c in sorted(choices.items())]
        return {**self.meta, "object": "chat.completion", "choices": out, "usage": usage_of(choices, self.n)}

    def _chunk(self, index: int, delta: dict[str, Any], finish: str | None = None, lps: Any = None) -> bytes:
        return self.enc({"index": index, "delta": delta, "logprobs": lps, "finish_reason": finish})

    def head(self) -> list[bytes]:
        samples = sorted(self.handle.samples.values(), key=lambda s: s.spec.index)
        return [b"".join(self._chunk(st.spec.index, {"role": "assistant", "content": ""}) for st in samples)]

    def event(self, ev: SampleEvent, parts: list[bytes]) -> None:
        if ev.text or ev.logprobs:
            lps = {"content": chat_logprobs(self.ctx.texts, ev.logprobs)} if self.req.logprobs else None
            parts.append(self._chunk(ev.index, {"content": ev.text}, None, lps))
        if ev.finish_reason is not None:
            parts.append(self._chunk(ev.index, {}, ev.finish_reason))

    def tail(self, last: dict[int, SampleEvent]) -> list[bytes]:
        return usage_tail(self.chunk_meta, self.with_usage, last, self.n)
