"""Token-id prompts skip per-id pydantic validation once check_prompt_shape passed them
(request_checks.parse_body_checked_prompt): the body is the one full validation would give. The
one-pass check and conversion (token_ids.py) accepts exactly what the element-wise check accepts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixrt.tokenizer_proc.errors import APIError
from radixrt.tokenizer_proc.openai_protocol import CompletionRequest, GenerateRequest
from radixrt.tokenizer_proc.request_checks import check_prompt_shape, parse_body, parse_body_checked_prompt
from radixrt.tokenizer_proc.token_ids import TokenIds, ids_array, own_ids, token_ids


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


_ELEMENTS = st.one_of(st.integers(min_value=-3, max_value=2**31 + 3),
                      st.sampled_from([0, 1, 2**31 - 1, 2**63]), st.booleans(),
                      st.floats(allow_nan=False), st.none(), st.text(max_size=2),
                      st.lists(st.integers(0, 5), max_size=2))


@given(st.lists(st.one_of(st.integers(min_value=0, max_value=50), _ELEMENTS), max_size=12))
def test_token_ids_accepts_exactly_the_int32_ids(value: list[object]) -> None:
    want = bool(value) and all(type(x) is int and 0 <= x < 2**31 for x in value)  # type: ignore[operator]
    got = token_ids(value)
    assert (got is not None) == want, value
    if got is not None:
        assert got == value and got.array.dtype == np.int32 and got.array.tolist() == value
        assert ids_array(got) is got.array and own_ids(got) is got


def test_checked_prompts_carry_their_arrays() -> None:
    ids = check_prompt_shape([5, 0, 7], "prompt")
    assert isinstance(ids, TokenIds) and ids.array.tolist() == [5, 0, 7]
    lists = check_prompt_shape([[1, 2], [3]], "prompt")
    assert all(isinstance(x, TokenIds) for x in lists) and lists == [[1, 2], [3]]
    assert type(check_prompt_shape([2**31], "prompt")) is list  # valid shape, beyond int32: a plain list
    assert ids_array([4, 5]).tolist() == [4, 5] and ids_array([4, 5]).dtype == np.int32
    assert check_prompt_shape("text", "prompt") == "text" and check_prompt_shape(["a"], "prompt") == ["a"]
