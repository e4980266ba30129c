"""POST /v1/chat/completions: chat template (with tools), then the `chat.completion` body or its SSE
chunks, with tool calls parsed out of the text when the request has tools (see docs/tool-calling.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from .assistant_output import read_whole
from .errors import bad_request
from .http_io import read_json
from .logprobs import chat_logprobs
from .openai_protocol import ChatCompletionRequest
from .openai_response import now_s, usage_of, usage_tail
from .reasoning_parser import ReasoningDelta, ReasoningStream, get_reasoning_parser
from .request_checks import check_model, parse_body
from .request_grammar import chat_grammar, grammar_fields
from .request_state import RequestHandle, SampleEvent
from .respond import Collected, ResponseWriter, respond
from .serving_context import ServingContext
from .sse import ChunkEncoder
from .submission import admit, openai_submission, tokenize
from .tool_grammar import ToolPlan, plan_tools
from .tool_parsers import (
    ParsedOutput,
    StreamDelta,
    ToolCallStream,
    ToolParser,
    assistant_message,
    detect_tool_parser,
    finish_reason_with_tools,
    plan_parser,
)
from .tool_prompt import render_chat


def server_tool_parser(ctx: ServingContext) -> str:
    """The --tool-call-parser name: the flag, else detected from the chat template, else "hermes"."""
    flag = getattr(ctx.args, "tool_call_parser", None)
    return flag or detect_tool_parser(getattr(ctx.tokenizer, "chat_template", None)) or "hermes"


async def chat_prompt_ids(ctx: ServingContext, req: ChatCompletionRequest, plan: ToolPlan) -> list[int]:
    """Render the chat template (tools and tool history included, with the generation prompt) and
    tokenize it.

    Raises:
        APIError: 400 when the model has no chat template or the template rejects the messages.
    """
    if not getattr(ctx.tokenizer, "chat_template", None):
        raise bad_request("this model has no chat template; use /v1/completions", param="messages")
    kwargs = dict(req.chat_template_kwargs or {})
    template = kwargs.pop("chat_template", None)  # a client's own template replaces the model's
    if template is not None and not getattr(ctx.args, "trust_request_chat_template", False):
        where = "chat_template_kwargs.chat_template"
        raise bad_request(f"{where}: a request's own chat template needs the server flag "
                          "--trust-request-chat-template", param=where)
    try:
        text = render_chat(ctx.tokenizer, req.messages, plan.render_tools or None,
                           add_generation_prompt=req.add_generation_prompt is not False,
                           template_kwargs=kwargs, chat_template=template,
                           continue_final_message=bool(req.continue_final_message))
    except Exception as e:  # jinja2 TemplateError and friends: the messages do not fit the template
        raise bad_request(f"the chat template rejected the messages: {e}", param="messages") from None
    return await tokenize(ctx, text)


# How a protocol answers a chat request: (validated request, handle, tool plan) -> its ResponseWriter.
WriterFactory = Callable[[ChatCompletionRequest, RequestHandle, ToolPlan], ResponseWriter]


async def chat_completions(ctx: ServingContext, request: Request) -> Response:
    """Validate the body, then serve it as a chat completion (serve_chat)."""
    body = parse_body(ChatCompletionRequest, await read_json(request, ctx.args.max_request_body_bytes))
    check_model(ctx, body.model)
    return await serve_chat(ctx, request, body,
                            lambda req, handle, plan: ChatWriter(ctx, req, handle, plan_parser(plan)))


async def serve_chat(ctx: ServingContext, request: Request, body: ChatCompletionRequest,
                     make_writer: WriterFactory) -> Response:
    """The one chat path (chat completions, and the Responses and Messages APIs translated onto it):
    plan tools and grammar, render the template, admit one prompt x n samples, answer through the
    protocol's writer as JSON or SSE. Stop strings and stop token ids do not apply to a forced call
    (tool_choice "required" or named; Messages' "any" / "tool"): the grammar admits only the call, and a
    stop inside it cut the arguments while the reply still said "tool_calls".

    Raises:
        APIError: 400s of planning, rendering and submission; the scheduler's rejections.
    """
    plan = plan_tools(body, server_tool_parser(ctx))
    if plan.forced and (body.stop or body.stop_token_ids):
        body = body.model_copy(update={"stop": None, "stop_token_ids": None})
    grammar = grammar_fields(chat_grammar(body, body, plan))
    ids = await chat_prompt_ids(ctx, body, plan)
    sub = openai_submission(ctx, body, [ids], prompt_param="messages", max_new_tokens=body.max_new_tokens(),
                            return_logprob=bool(body.logprobs), top_logprobs_num=body.top_logprobs or 0,
                            grammar=grammar)
    handle = admit(ctx, sub)
    return await respond(request, handle, make_writer(body, handle, plan))


class ChatWriter:
    """Chat bodies (a ResponseWriter): `chat.completion`, or SSE chunks of `chat.completion.chunk`.

    A stream: a role delta per choice, content deltas (and `delta.tool_calls` deltas when `parser` is
    set: one ToolCallStream per choice), one finish chunk per choice ("tool_calls" when the choice made
    calls and stopped), the usage chunk (with `stream_options.include_usage`), [DONE].
    `parser`: the tool-call parser to read calls with (tool_parsers.plan_parser); None: the text is
    plain content.
    """

    def __init__(self, ctx: ServingContext, req: ChatCompletionRequest, handle: RequestHandle,
                 parser: ToolParser | None = None) -> None:
        self.ctx, self.req, self.handle = ctx, req, handle
        self.meta = {"id": f"chatcmpl-{handle.id}", "created": now_s(), "model": ctx.served_model}
        self.n = req.n or 1
        self.with_usage = req.include_usage()
        self.chunk_meta = {**self.meta, "object": "chat.completion.chunk"}
        self.enc = ChunkEncoder(self.chunk_meta, {"usage": None} if self.with_usage else {})
        self.parser = parser
        self.streams: dict[int, ToolCallStream] = {}
        self.num_calls: dict[int, int] = {}
        self.reasoning = get_reasoning_parser(getattr(ctx.args, "reasoning_parser", None))
        self.thinking: dict[int, ReasoningStream] = {}

    def _message(self, c: Collected) -> tuple[dict[str, Any], str | None]:
        turn = read_whole(c.text, self.reasoning, self.parser)
        if self.parser is None:
            message: dict[str, Any] = {"role": "assistant", "content": turn.content}
        else:
            message = assistant_message(ParsedOutput(turn.content, turn.tool_calls))
        if self.reasoning is not None:
            message["reasoning_content"] = turn.reasoning or None
        return message, finish_reason_with_tools(c.finish_reason, len(turn.tool_calls))

    def _think(self, ev: SampleEvent, parts: list[bytes]) -> SampleEvent:
        """With a reasoning parser: send the event's reasoning as `delta.reasoning_content` chunks and
        return the event with only its answer text (what the content / tool-call path reads)."""
        assert self.reasoning is not None
        stream = self.thinking.get(ev.index)
        if stream is None:
            stream = self.thinking[ev.index] = self.reasoning.stream()
        d = stream.feed(ev.text)
        if ev.finish_reason is not None:
            tail = stream.finish()
            d = ReasoningDelta(d.reasoning + tail.reasoning, d.content + tail.content)
        if d.reasoning:
            parts.append(self._chunk(ev.index, {"reasoning_content": d.reasoning}))
        return replace(ev, text=d.content)

    def body(self, choices: dict[int, Collected]) -> dict[str, Any]:
        want_lp = bool(self.req.logprobs)
        out = []
        for i, c in sorted(choices.items()):
            message, finish = self._message(c)
            lps = {"content": chat_logprobs(self.ctx.texts, c.logprobs)} if want_lp else None
            out.append({"index": i, "message": message, "logprobs": lps,
                        "finish_reason": finish, "matched_stop": c.matched_stop})
        return {**self.meta, "object": "chat.completion", "choices": out, "usage": usage_of(choices, self.n)}

    def _chunk(self, index: int, delta: dict[str, Any], finish: str | None = None, lps: Any = None) -> bytes:
        return self.enc({"index": index, "delta": delta, "logprobs": lps, "finish_reason": finish})

    def head(self) -> list[bytes]:
        samples = sorted(self.handle.samples.values(), key=lambda s: s.spec.index)
        return [b"".join(self._chunk(st.spec.index, {"role": "assistant", "content": ""}) for st in samples)]

    def _tool_deltas(self, ev: SampleEvent) -> StreamDelta:
        assert self.parser is not None
        stream = self.streams.get(ev.index)
        if stream is None:
            stream = self.streams[ev.index] = self.parser.stream()
        d = stream.feed(ev.text) if ev.text else StreamDelta()
        if ev.finish_reason is not None:
            tail = stream.finish()
            d = StreamDelta(d.content + tail.content, d.tool_calls + tail.tool_calls)
        self.num_calls[ev.index] = self.num_calls.get(ev.index, 0) + sum(
            1 for td in d.tool_calls if td.id is not None)
        return d

    def event(self, ev: SampleEvent, parts: list[bytes]) -> None:
        if self.reasoning is not None:
            ev = self._think(ev, parts)
        lps = None
        if self.req.logprobs and ev.logprobs:
            lps = {"content": chat_logprobs(self.ctx.texts, ev.logprobs)}
        if self.parser is None:
            if ev.text or lps is not None:
                parts.append(self._chunk(ev.index, {"content": ev.text}, None, lps))
            if ev.finish_reason is not None:
                parts.append(self._chunk(ev.index, {}, ev.finish_reason))
            return
        d = self._tool_deltas(ev)
        if d.content or (lps is not None and not d.tool_calls):
            parts.append(self._chunk(ev.index, {"content": d.content}, None, lps))
            lps = None
        if d.tool_calls:
            parts.append(self._chunk(ev.index, {"tool_calls": [td.to_openai() for td in d.tool_calls]},
                                     None, lps))
        if ev.finish_reason is not None:
            finish = finish_reason_with_tools(ev.finish_reason, self.num_calls.get(ev.index, 0))
            parts.append(self._chunk(ev.index, {}, finish))

    def tail(self, last: dict[int, SampleEvent]) -> list[bytes]:
        return usage_tail(self.chunk_meta, self.with_usage, last, self.n)
