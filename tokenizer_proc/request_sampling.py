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
from .openai_protocol import SamplingFields, check_logit_bias_keys, check_stop_strings
from .serving_context import ServingContext

_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
_SAMPLING_ADAPTER = TypeAdapter(SamplingParams)  # strict JSON-mode validation, then __post_init__


def build_sampling(req: SamplingFields, max_new_tokens: int | None, ctx: ServingContext) -> dict[str, Any]:
    """OpenAI fields -> SamplingParams dict (validated by SamplingParams too).

    Raises:
        APIError: 400 with `param` set.
    """
    _check_in_vocab(req.logit_bias or {}, req.stop_token_ids or [], ctx.vocab_size)
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


def _check_in_vocab(logit_bias: dict[str, float], stop_token_ids: list[int], vocab_size: int,
                    prefix: str = "") -> None:
    """Raises APIError 400 (param `prefix` + the field) for a logit_bias key or a stop token id that is
    not a token id of the vocabulary, [0, vocab_size). The keys are digit strings already."""
    for key in logit_bias:
        if int(key) >= vocab_size:
            raise bad_request(f"{prefix}logit_bias: token id {key} is out of range (vocabulary size "
                              f"{vocab_size})", param=f"{prefix}logit_bias")
    for tid in stop_token_ids:
        if not 0 <= tid < vocab_size:
            raise bad_request(f"{prefix}stop_token_ids: token id {tid} is out of range (vocabulary size "
                              f"{vocab_size})", param=f"{prefix}stop_token_ids")


def generate_sampling(raw: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """`sampling_params` -> SamplingParams dict; unknown keys and bad values are 400s naming the key.

    The rules of chat and completions apply too (openai_protocol.check_stop_strings,
    check_logit_bias_keys, and token ids in the vocabulary), so one value gets one answer on every
    route."""
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
    for name, check in (("stop", check_stop_strings), ("logit_bias", check_logit_bias_keys)):
        try:
            check(getattr(sp, name))
        except ValueError as e:
            raise bad_request(f"sampling_params.{name}: {e}", param=f"sampling_params.{name}") from None
    _check_in_vocab(sp.logit_bias, sp.stop_token_ids, vocab_size, prefix="sampling_params.")
    return sp.to_dict()
