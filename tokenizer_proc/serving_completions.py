"""POST /v1/completions: prompts as text or token ids (one or several), echo, legacy logprobs, SSE."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from .detokenizer import decode
from .http_io import read_json
from .logprobs import CompletionLogprobs
from .openai_protocol import CompletionRequest
from .openai_response import now_s, usage_of, usage_tail
from .request_checks import check_model, check_prompt_shape, parse_body, parse_body_checked_prompt
from .request_grammar import constraint_grammar, grammar_fields
from .request_state import RequestHandle, SampleEvent
from .respond import Collected, respond
from .serving_context import ServingContext
from .sse import ChunkEncoder
from .submission import admit, openai_submission, tokenize
from .token_ids import own_ids

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint


async def prompt_ids(ctx: ServingContext, req: CompletionRequest) -> list[list[int]]:
    """Normalize `prompt` (str | [str] | [int] | [[int]]) to token-id lists (checked later)."""
    p = req.prompt
    if isinstance(p, str):
        return [await tokenize(ctx, p)]
    if all(isinstance(x, str) for x in p):
        return [await tokenize(ctx, x) for x in p]  # type: ignore[arg-type]
    if isinstance(p[0], int):  # a token-id list (validated: prompts do not mix ids and lists)
        return [own_ids(p)]  # type: ignore[arg-type]
    return [own_ids(x) for x in p]  # type: ignore[arg-type]


async def completions(ctx: ServingContext, request: Request) -> Response:
    """Validate, tokenize the prompts, admit prompts x n samples, answer as JSON or SSE."""
    raw = await read_json(request, ctx.args.max_request_body_bytes)
    if isinstance(raw, dict) and "prompt" in raw:
        raw["prompt"] = check_prompt_shape(raw["prompt"], "prompt")
        body = parse_body_checked_prompt(CompletionRequest, raw, "prompt")
    else:
        body = parse_body(CompletionRequest, raw)
    check_model(ctx, body.model)
    grammar = grammar_fields(constraint_grammar(body))
    prompts = await prompt_ids(ctx, body)
    max_new = body.max_tokens if body.max_tokens is not None else DEFAULT_MAX_TOKENS
    sub = openai_submission(ctx, body, prompts, prompt_param="prompt", max_new_tokens=max_new,
                            return_logprob=body.logprobs is not None, top_logprobs_num=body.logprobs or 0,
                            grammar=grammar)
    handle = admit(ctx, sub)
    return await respond(request, handle, CompletionWriter(ctx, body, handle))


def _prompt_of(handle: RequestHandle, index: int) -> list[int]:
    for st in handle.samples.values():
        if st.spec.index == index:
            return st.spec.input_ids
    return []


class CompletionWriter:
    """Completion bodies (a ResponseWriter): `text_completion` JSON, or its SSE chunks.

    A stream: the echoed prompt per choice (with `echo`), text deltas, a finish chunk per choice, the
    usage chunk (with `stream_options.include_usage`), [DONE].
    """

    def __init__(self, ctx: ServingContext, req: CompletionRequest, handle: RequestHandle) -> None:
        self.ctx, self.req, self.handle = ctx, req, handle
        self.meta = {"id": f"cmpl-{handle.id}", "object": "text_completion", "created": now_s(),
                     "model": ctx.served_model}
        self.n = req.n or 1
        self.want_lp = req.logprobs is not None
        self.want_ids = bool(req.return_token_ids)
        self.with_usage = req.include_usage()
        self.enc = ChunkEncoder(self.meta, {"usage": None} if self.with_usage else {})
        self.accs: dict[int, CompletionLogprobs] = {}  # streamed legacy logprobs, by choice index

    def _logprobs(self) -> CompletionLogprobs:
        return CompletionLogprobs(self.ctx.texts, skip_special=self.req.skip_special_tokens is not False)

    def _text_prompt(self, index: int) -> str | None:
        """Choice `index`'s prompt as sent when it was text (None for token ids)."""
        p = self.req.prompt
        if isinstance(p, str):
            return p
        if isinstance(p, list) and p and all(isinstance(x, str) for x in p):
            return p[index // (self.req.n or 1)]
        return None

    def _echo_skips_special(self) -> bool:
        """Whether the echoed prompt leaves out special tokens: not a text prompt (echoed as sent)."""
        return self._text_prompt(0) is None and self.req.skip_special_tokens is not False

    def _echo_text(self, index: int) -> str:
        """The echoed prompt of choice `index`: a text prompt exactly as sent (special tokens in it
        included, as vLLM echoes), a token-id prompt decoded (skip_special_tokens applies)."""
        if not self.req.echo:
            return ""
        text = self._text_prompt(index)
        if text is not None:
            return text
        skip_special = self.req.skip_special_tokens is not False
        return decode(self.ctx.tokenizer, _prompt_of(self.handle, index), skip_special)

    def body(self, choices: dict[int, Collected]) -> dict[str, Any]:
        out = []
        for i, c in sorted(choices.items()):
            lp_obj: dict[str, Any] | None = None
            if self.want_lp:
                acc = self._logprobs()
                if self.req.echo:
                    acc.add_prompt(_prompt_of(self.handle, i), self._echo_skips_special())
                acc.add(c.logprobs)
                lp_obj = acc.take()
            out.append({"index": i, "text": self._echo_text(i) + c.text, "logprobs": lp_obj,
                        "finish_reason": c.finish_reason, "matched_stop": c.matched_stop,
                        **({"token_ids": c.token_ids} if self.want_ids else {})})
        return {**self.meta, "choices": out, "usage": usage_of(choices, self.n)}

    def _chunk(self, index: int, text: str, finish: str | None = None, lps: Any = None,
               ids: list[int] | None = None) -> bytes:
        choice = {"index": index, "text": text, "logprobs": lps, "finish_reason": finish}
        if self.want_ids:
            choice["token_ids"] = ids or []
        return self.enc(choice)

    def head(self) -> list[bytes]:
        writes = []
        for st in sorted(self.handle.samples.values(), key=lambda s: s.spec.index):
            i = st.spec.index
            acc = self.accs[i] = self._logprobs()
            if self.req.echo:
                acc.add_prompt(st.spec.input_ids, self._echo_skips_special())
                writes.append(self._chunk(i, self._echo_text(i), None, acc.take() if self.want_lp else None))
        return writes

    def event(self, ev: SampleEvent, parts: list[bytes]) -> None:
        if ev.text or ev.logprobs or (self.want_ids and ev.token_ids):
            lps = None
            if self.want_lp:
                self.accs[ev.index].add(ev.logprobs)
                lps = self.accs[ev.index].take()
            parts.append(self._chunk(ev.index, ev.text, None, lps, ev.token_ids))
        if ev.finish_reason is not None:
            parts.append(self._chunk(ev.index, "", ev.finish_reason))

    def tail(self, last: dict[int, SampleEvent]) -> list[bytes]:
        return usage_tail(self.meta, self.with_usage, last, self.n)
