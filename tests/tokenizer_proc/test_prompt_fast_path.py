"""Token-id prompts skip per-id pydantic validation once check_prompt_shape passed them
(request_checks.parse_body_checked_prompt): the body is the one full validation would give."""

from __future__ import annotations

import pytest

from radixrt.tokenizer_proc.errors import APIError
from radixrt.tokenizer_proc.openai_protocol import CompletionRequest, GenerateRequest
from radixrt.tokenizer_proc.request_checks import check_prompt_shape, parse_body, parse_body_checked_prompt


@pytest.mark.parametrize("prompt", [list(range(5, 2000)), [[1, 2, 3], [4], [5, 6]], "text", ["a", "b"]])
def test_checked_prompt_body_equals_the_fully_validated_one(prompt: object) -> None:
    raw = {"model": "m", "prompt": prompt, "max_tokens": 4, "temperature": 0.5, "stream": True}
    check_prompt_shape(raw["prompt"], "prompt")
    assert parse_body_checked_prompt(CompletionRequest, raw, "prompt") == parse_body(CompletionRequest, raw)


def test_other_fields_are_still_validated() -> None:
    raw = {"model": "m", "prompt": [1, 2, 3], "temperature": "hot"}
    with pytest.raises(APIError) as e:
        parse_body_checked_prompt(CompletionRequest, raw, "prompt")
    assert e.value.param == "temperature"


def test_generate_input_ids() -> None:
    raw = {"input_ids": [[7, 8], [9]], "sampling_params": {"max_new_tokens": 2}}
    check_prompt_shape(raw["input_ids"], "input_ids", allow_text=False)
    body = parse_body_checked_prompt(GenerateRequest, raw, "input_ids")
    assert body.input_ids == [[7, 8], [9]] and body == parse_body(GenerateRequest, raw)


@pytest.mark.parametrize("prompt", [[1, True], [1, -1], [1, 2.0], [[1], [2, -3]]])
def test_the_fast_shape_check_still_rejects(prompt: object) -> None:
    with pytest.raises(APIError):
        check_prompt_shape(prompt, "prompt")
