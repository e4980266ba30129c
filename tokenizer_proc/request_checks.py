"""Request validation before generation: the body model, the model id, the prompt's shape and size.

Every failure is an APIError whose `param` names the field (400, or 404 for an unknown model), raised
before anything is submitted to the scheduler.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import APIError, bad_request, from_validation_error
from .serving_context import ServingContext
from .token_ids import TokenIds, token_ids

M = TypeVar("M", bound=BaseModel)


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


def parse_body_checked_prompt(model: type[M], obj: dict[str, Any], key: str) -> M:
    """parse_body for a body whose prompt `obj[key]` is what check_prompt_shape returned.

    Validating a token-id list costs pydantic ~0.5 us per id (a 2,000-token prompt: ~1 ms on the
    event loop, per request): the model validates a one-id stand-in of the same shape instead and
    gets the checked value assigned (check_prompt_shape accepts exactly the ints >= 0 and the shapes
    that the strict model does). Text prompts are validated as they are. Raises APIError as parse_body.
    """
    value = obj.get(key)
    if isinstance(value, list) and value and isinstance(value[0], int | list):
        stand_in = [value[0]] if isinstance(value[0], int) else [[x[0]] for x in value]
        body = parse_body(model, {**obj, key: stand_in})
        setattr(body, key, value)
        return body
    return parse_body(model, obj)


def check_model(ctx: ServingContext, name: str) -> None:
    """Raises APIError 404 `model_not_found` unless `name` is the served model id."""
    if name != ctx.served_model:
        raise APIError(404, f"The model `{name}` does not exist. This server serves: {ctx.served_model}.",
                       param="model", code="model_not_found")


def check_prompt(ctx: ServingContext, ids: list[int], param: str = "messages") -> None:
    """Raises APIError 400 for an empty prompt, an unknown token id, or a prompt without room to generate."""
    if not ids:
        raise bad_request("the prompt is empty", param=param)
    top = int(ids.array.max()) if type(ids) is TokenIds else max(ids)
    if top >= ctx.vocab_size:
        raise bad_request(f"token id {top} is out of range (vocabulary size {ctx.vocab_size})",
                          param=param)
    if len(ids) >= ctx.context_length:
        raise bad_request(
            f"This model's maximum context length is {ctx.context_length} tokens. However, your prompt "
            f"has {len(ids)} tokens, which leaves no room for the completion.",
            param=param, code="context_length_exceeded")


def check_prompts(ctx: ServingContext, prompts: list[list[int]], param: str) -> None:
    """check_prompt on each prompt in order; the first failure is raised."""
    for ids in prompts:
        check_prompt(ctx, ids, param=param)


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


def check_prompt_shape(value: Any, param: str, allow_text: bool = True) -> Any:
    """Name the problem of a malformed prompt before generic validation does; return the prompt.

    Accepted shapes: a string, a non-empty list of strings, a non-empty list of token ids (integers
    >= 0), or a non-empty list of non-empty token-id lists (without text when `allow_text` is false).
    Token ids beyond the vocabulary are checked later (check_prompt). Returned: `value` itself, but
    a token-id list below 2**31 as TokenIds (its int32 array made in the same pass; token_ids.py),
    and a list of them as a list of TokenIds.

    Raises:
        APIError: 400 with `param` set and the offending element named, e.g. `prompt[1][0]`.
    """
    what = ("a string, a list of strings, a list of token ids, or a list of token-id lists" if allow_text
            else "a list of token ids or a list of token-id lists")
    if isinstance(value, str) and allow_text:
        return value
    if not isinstance(value, list):
        raise bad_request(f"{param} must be {what}; got {_kind(value)}", param=param)
    if not value:
        raise bad_request(f"{param} must not be an empty list", param=param)
    first = value[0]
    if isinstance(first, str) and allow_text:
        _check_texts(value, param)
        return value
    if isinstance(first, list):
        return _check_id_lists(value, param)
    return _check_ids(value, param, allow_text)


def _check_texts(value: list[Any], param: str) -> None:
    for i, x in enumerate(value):
        if not isinstance(x, str):
            raise bad_request(f"{param}[{i}]: expected a string like {param}[0] (a list of prompts "
                              f"cannot mix text and token ids), got {_kind(x)}", param=param)


def _check_id_lists(value: list[Any], param: str) -> list[list[int]]:
    out: list[list[int]] = []
    for i, x in enumerate(value):
        if not isinstance(x, list):
            raise bad_request(f"{param}[{i}]: expected a token-id list like {param}[0] (prompts cannot "
                              f"mix token ids and token-id lists), got {_kind(x)}", param=param)
        if not x:
            raise bad_request(f"{param}[{i}]: empty token-id list", param=param)
        ids = token_ids(x)  # the fast path: one C-level pass (token_ids.py)
        if ids is None:
            for j, t in enumerate(x):
                err = _token_id_error(t, f"{param}[{i}][{j}]")
                if err:
                    raise bad_request(err, param=param)
        out.append(x if ids is None else ids)
    return out


def _check_ids(value: list[Any], param: str, allow_text: bool) -> list[int]:
    ids = token_ids(value)  # the fast path; naming the offending element is only for malformed prompts
    if ids is not None:
        return ids
    for i, x in enumerate(value):
        if isinstance(x, list) and i > 0:
            raise bad_request(f"{param}[{i}]: expected a token id like {param}[0] (prompts cannot mix "
                              "token ids and token-id lists), got a list", param=param)
        if isinstance(x, str):
            why = "a list of prompts cannot mix text and token ids" if allow_text else "no text here"
            raise bad_request(f"{param}[{i}]: expected a token id, got a string ({why})", param=param)
        err = _token_id_error(x, f"{param}[{i}]")
        if err:
            raise bad_request(err, param=param)
    return value  # ids >= 2**31: valid here, out of every vocabulary (check_prompt)
