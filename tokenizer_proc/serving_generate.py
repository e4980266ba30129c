"""POST /generate: the native (SGLang-style) API. Text or token ids in, text + meta_info out.

Non-streaming reply (one prompt): {"text", "output_ids", "meta_info": {id, prompt_tokens, completion_tokens,
cached_tokens, finish_reason, matched_stop[, output_token_logprobs, output_top_logprobs]}}; a batch
(list of texts / of id lists) gets a list of those. Streaming sends the same object after each
step with the *cumulative* text (as SGLang does), then `data: [DONE]`.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from .errors import bad_request
from .http_io import json_response, read_json
from .openai_protocol import GenerateRequest
from .request_checks import check_prompt_shape, check_prompts, parse_body, parse_body_checked_prompt
from .request_grammar import generate_grammar, grammar_fields
from .request_sampling import generate_sampling
from .request_state import RequestHandle, SampleEvent, TokenLogprob
from .respond import Collected, respond
from .serving_context import ServingContext
from .sse import SSE_DONE, sse
from .submission import Submission, admit, tokenize
from .token_ids import own_ids


async def _prompts(ctx: ServingContext, req: GenerateRequest) -> tuple[list[list[int]], bool]:
    """Token-id prompts and whether the request was a batch."""
    if req.text is not None:
        texts = req.text if isinstance(req.text, list) else [req.text]
        return [await tokenize(ctx, t) for t in texts], isinstance(req.text, list)
    ids = req.input_ids or []
    if ids and isinstance(ids[0], list):
        return [own_ids(x) for x in ids], True  # type: ignore[arg-type]
    return [own_ids(ids)], False  # type: ignore[arg-type]


async def generate(ctx: ServingContext, request: Request) -> Response:
    """Validate (sampling first, then the prompts), admit one sample per prompt, answer as JSON or SSE."""
    raw = await read_json(request, ctx.args.max_request_body_bytes)
    if isinstance(raw, dict) and raw.get("input_ids") is not None:
        raw["input_ids"] = check_prompt_shape(raw["input_ids"], "input_ids", allow_text=False)
        body = parse_body_checked_prompt(GenerateRequest, raw, "input_ids")
    else:
        body = parse_body(GenerateRequest, raw)
    params, grammar = generate_grammar(body.sampling_params)
    sampling = generate_sampling(params, ctx.vocab_size)
    kind, text = grammar_fields(grammar)
    prompts, batch = await _prompts(ctx, body)
    check_prompts(ctx, prompts, "input_ids" if body.input_ids is not None else "text")
    rids = _client_rids(ctx, body.rid, len(prompts), batch)
    sub = Submission(prompts=prompts, sampling=sampling, stop=list(sampling["stop"]),
                     stream=bool(body.stream), return_logprob=bool(body.return_logprob),
                     top_logprobs_num=body.top_logprobs_num or 0, grammar_kind=kind, grammar_text=text,
                     cache_salt=body.cache_salt)
    handle = admit(ctx, sub)
    if rids:
        ctx.client_rids.update({r: (handle, i) for i, r in enumerate(rids)})
        handle.add_done_callback(lambda: [ctx.client_rids.pop(r, None) for r in rids])
    return await respond(request, handle, GenerateWriter(ctx, handle, sub.return_logprob, batch, rids))


def _client_rids(ctx: ServingContext, rid: str | list[str] | None, num_prompts: int,
                 batch: bool) -> list[str]:
    """The client's request id per prompt ([] without `rid`).

    Raises:
        APIError: 400 on `rid` when its shape does not match the prompts (a string for one prompt, a
            list of one per prompt for a batch), when it repeats an id, or names one in flight.
    """
    if rid is None:
        return []
    rids = rid if isinstance(rid, list) else [rid]
    if isinstance(rid, list) != batch or len(rids) != num_prompts:
        raise bad_request(f"rid: give one request id per prompt ({num_prompts}; a string for a single "
                          "prompt, a list for a batch)", param="rid")
    if not all(0 < len(r) <= 256 for r in rids):
        raise bad_request("rid: request ids are strings of 1 to 256 characters", param="rid")
    if len(set(rids)) != len(rids):
        raise bad_request("rid: request ids must be distinct", param="rid")
    for r in rids:
        if r in ctx.client_rids:
            raise bad_request(f"rid: request {r!r} is already in flight", param="rid")
    return rids


async def abort_request(ctx: ServingContext, request: Request) -> Response:
    """POST /abort_request {"rid": ...} (SGLang's): the /generate request of that `rid` stops now; its
    reply ends with finish_reason "abort" and the tokens made so far. Unknown or finished ids: nothing
    to do (200, `"aborted": false`), as the request may have just ended."""
    raw = await read_json(request, ctx.args.max_request_body_bytes)
    rid = raw.get("rid") if isinstance(raw, dict) else None
    if not isinstance(rid, str) or not rid:
        raise bad_request("rid: the request id to abort, a non-empty string", param="rid")
    entry = ctx.client_rids.get(rid)
    aborted = entry is not None and entry[0].abort_sample(entry[1])
    return json_response({"rid": rid, "aborted": aborted})


class GenerateWriter:
    """/generate bodies (a ResponseWriter): a result, or a list of them for a batch; streamed, the
    cumulative result after each event, then [DONE]."""

    def __init__(self, ctx: ServingContext, handle: RequestHandle, want_lp: bool, batch: bool,
                 rids: list[str] | None = None) -> None:
        self.ctx, self.handle, self.want_lp, self.batch = ctx, handle, want_lp, batch
        self.rids = rids or []  # the client's ids by choice index (`rid`), else the server's
        self.acc: dict[int, Collected] = {}  # streamed output so far, by choice index

    def _lp_meta(self, lps: list[TokenLogprob]) -> dict[str, Any]:
        def txt(tid: int) -> str:
            return self.ctx.texts.get(tid)[0]
        return {"output_token_logprobs": [[lp.logprob, lp.token_id, txt(lp.token_id)] for lp in lps],
                "output_top_logprobs": [[[v, t, txt(t)] for t, v in lp.top] for lp in lps]}

    def _result(self, index: int, c: Collected) -> dict[str, Any]:
        rid = self.rids[index] if index < len(self.rids) else f"{self.handle.id}-{index}"
        meta: dict[str, Any] = {"id": rid, "prompt_tokens": c.prompt_tokens,
                                "completion_tokens": c.completion_tokens, "cached_tokens": c.cached_tokens,
                                "finish_reason": c.finish_reason, "matched_stop": c.matched_stop}
        if self.want_lp:
            meta.update(self._lp_meta(c.logprobs))
        return {"text": c.text, "output_ids": c.token_ids, "meta_info": meta}

    def body(self, choices: dict[int, Collected]) -> Any:
        results = [self._result(i, c) for i, c in sorted(choices.items())]
        return results if self.batch else results[0]

    def head(self) -> list[bytes]:
        return []

    def event(self, ev: SampleEvent, parts: list[bytes]) -> None:
        c = self.acc.setdefault(ev.index, Collected())
        c.add(ev)
        parts.append(sse({"index": ev.index, **self._result(ev.index, c)}))

    def tail(self, last: dict[int, SampleEvent]) -> list[bytes]:
        return [SSE_DONE]
