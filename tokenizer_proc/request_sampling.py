"""A request's sampling fields -> a validated SamplingParams dict (what GenerateReq carries).

Two spellings reach the same SamplingParams: OpenAI's top-level fields (chat, completions, and any
protocol translated onto SamplingFields) and the native `sampling_params` object of /generate.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError

from radixrt.sampling_params import SamplingParams

from .errors import bad_request, from_sampling_error
from .openai_protocol import SamplingFields
from .serving_context import ServingContext

_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
_SAMPLING_ADAPTER = TypeAdapter(SamplingParams)  # strict JSON-mode validation, then __post_init__


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
