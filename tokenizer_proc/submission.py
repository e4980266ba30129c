"""The one path from a validated request to a RequestHandle: prompt token ids + sampling -> samples.

Every protocol handler ends its translation in a Submission (checked prompt token ids, a
SamplingParams dict, n, stop strings, stream and logprob flags) and calls `admit`, which fans it out
into samples (prompt x n), applies the server's in-flight limits and returns the RequestHandle.
The samples' GenerateReqs go to the scheduler when the handle is entered (respond.respond does that).
`openai_submission` is the translation of anything spelled with OpenAI's SamplingFields.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from radixrt.sampling_params import offset_seed

from .errors import APIError
from .openai_protocol import SamplingFields
from .request_checks import check_prompts
from .request_sampling import build_sampling
from .request_state import RequestHandle, SampleSpec
from .serving_context import ServingContext

_OFFLOAD_CHARS = 32_768  # tokenize prompts longer than this in a thread, off the event loop


@dataclass(frozen=True, slots=True)
class Submission:
    """A validated request in the engine's terms; what every protocol translates into."""

    prompts: list[list[int]]  # token ids per prompt, already checked (check_prompts)
    sampling: dict[str, Any]  # SamplingParams.to_dict()
    stop: list[str]  # stop strings, matched on each sample's text
    n: int = 1  # samples per prompt
    skip_special_tokens: bool = True
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    grammar_kind: str | None = None  # the output constraint (GenerateReq.grammar_kind); None: none
    grammar_text: str = ""
    cache_salt: str | None = None  # the prefix cache's tenant namespace (GenerateReq.cache_salt)


async def tokenize(ctx: ServingContext, text: str) -> list[int]:
    """Encode text (special tokens in the text are parsed, no BOS/EOS added beyond the template's own).

    Texts longer than 32 Ki characters are encoded in a worker thread, off the event loop."""
    def run() -> list[int]:
        return list(ctx.tokenizer.encode(text, add_special_tokens=False))
    if len(text) > _OFFLOAD_CHARS:
        return await asyncio.to_thread(run)
    return run()


def openai_submission(ctx: ServingContext, req: SamplingFields, prompts: list[list[int]], *,
                      prompt_param: str, max_new_tokens: int | None, return_logprob: bool,
                      top_logprobs_num: int, grammar: tuple[str | None, str] = (None, "")) -> Submission:
    """The Submission of a request with OpenAI sampling fields: prompts checked first, then sampling.

    `grammar`: (kind, text) of the output constraint, already validated (request_grammar.py).

    Raises:
        APIError: 400 naming `prompt_param` for a bad prompt, or the sampling field at fault.
    """
    check_prompts(ctx, prompts, prompt_param)
    sampling = build_sampling(req, max_new_tokens, ctx)
    return Submission(prompts=prompts, sampling=sampling, stop=req.stop_list(), n=req.n or 1,
                      skip_special_tokens=req.skip_special_tokens is not False, stream=bool(req.stream),
                      return_logprob=return_logprob, top_logprobs_num=top_logprobs_num,
                      grammar_kind=grammar[0], grammar_text=grammar[1], cache_salt=req.cache_salt)


def make_specs(prompts: list[list[int]], n: int, sampling: dict[str, Any], stop: list[str],
               skip_special_tokens: bool, grammar: tuple[str | None, str] = (None, "")) -> list[SampleSpec]:
    """Choice index = prompt_index * n + j (OpenAI's order for several prompts with n > 1).

    With a `seed` and n > 1, sample j gets seed + j: the n choices differ from each other, and the
    same request gives the same n choices again."""
    def sampling_of(j: int) -> dict[str, Any]:
        sp = dict(sampling)
        if sp.get("seed") is not None and n > 1:
            sp["seed"] = offset_seed(int(sp["seed"]), j)
        return sp

    return [SampleSpec(index=p * n + j, input_ids=ids, sampling=sampling_of(j), stop=stop,
                       skip_special_tokens=skip_special_tokens, grammar_kind=grammar[0],
                       grammar_text=grammar[1])
            for p, ids in enumerate(prompts) for j in range(n)]


def _refused(ctx: ServingContext, err: APIError) -> APIError:
    """`err`, after counting the request it refuses in the metrics as RequestHandle counts an
    APIError: "rejected" below status 500, "error" from it (the 503 of a shutdown)."""
    if ctx.on_done is not None:
        ctx.on_done(None, "rejected" if err.status < 500 else "error")
    return err


def new_handle(ctx: ServingContext, specs: list[SampleSpec], *, stream: bool, return_logprob: bool = False,
               top_logprobs_num: int = 0) -> RequestHandle:
    """A handle for `specs`.

    Raises:
        APIError: 503 while shutting down; 400 when `specs` alone exceed what the server can ever
            take at once; 429 when the server already tracks too many samples. Each refusal is
            counted in the metrics (`_refused`), as the scheduler's refusals are.
    """
    if ctx.manager.closing:
        raise _refused(ctx, APIError(503, "server is shutting down"))
    # More samples than --max-running-requests + --max-queued-requests can never all be in flight
    # (the scheduler queues only what the running set cannot take): never admitted, not worth a retry
    most = ctx.manager.max_inflight
    if len(specs) > most:
        raise _refused(ctx, APIError(
            400, f"the request has {len(specs)} samples (prompts x n); this server takes at most {most} "
            "at once (--max-running-requests + --max-queued-requests)", param="n"))
    if not ctx.manager.has_capacity(len(specs)):
        raise _refused(ctx, APIError(429, "too many requests in flight; retry later"))
    return RequestHandle(ctx.manager, ctx.tokenizer, specs, stream=stream, return_logprob=return_logprob,
                         top_logprobs_num=top_logprobs_num, on_done=ctx.on_done,
                         timeout_s=ctx.args.request_timeout)


def admit(ctx: ServingContext, sub: Submission) -> RequestHandle:
    """`sub` fanned out into samples (make_specs) under a new handle (new_handle; same errors).

    Raises:
        APIError: also 400 `param: cache_salt` without a salt under --require-cache-salt.
    """
    if ctx.args.require_cache_salt and sub.cache_salt is None:
        raise APIError(400, "cache_salt is required by this server (--require-cache-salt)",
                       param="cache_salt", code="missing_cache_salt")
    specs = make_specs(sub.prompts, sub.n, sub.sampling, sub.stop, sub.skip_special_tokens,
                       (sub.grammar_kind, sub.grammar_text))
    for spec in specs:
        spec.cache_salt = sub.cache_salt
    return new_handle(ctx, specs, stream=sub.stream, return_logprob=sub.return_logprob,
                      top_logprobs_num=sub.top_logprobs_num)
