"""OpenAI conformance through a real server: every bad input gets its status and error body, while a
well-formed request generating at the same time completes untouched."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import Server
from tests.e2e.test_conformance import MODEL, good_request_in_flight

CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


def post(server: Server, path: str, body: Any = None, content: bytes | None = None) -> httpx.Response:
    if content is not None:
        return httpx.post(f"{server.base_url}{path}", content=content,
                          headers={"content-type": "application/json"}, timeout=30)
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=30)


def check_error(r: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def test_unknown_model_is_404_naming_the_served_model(server: Server) -> None:
    with good_request_in_flight(server):
        r = post(server, CHAT, {"model": "gpt-4o", "messages": MSGS})
    err = check_error(r, 404, param="model", code="model_not_found")
    assert MODEL in err["message"] and err["type"] == "not_found_error"


@pytest.mark.parametrize("content", [b'{"model": "x", "messages": [', b"", b"\xff\xfe"],
                         ids=["truncated", "empty", "not-utf8"])
def test_malformed_json_is_400(server: Server, content: bytes) -> None:
    with good_request_in_flight(server):
        r = post(server, CHAT, content=content)
    check_error(r, 400)


@pytest.mark.parametrize("body", [[1, 2], "hello", 3, None], ids=["list", "string", "number", "null"])
def test_non_object_json_is_400(server: Server, body: Any) -> None:
    with good_request_in_flight(server):
        r = post(server, CHAT, content=httpx.Request("POST", "/", json=body).content)
    check_error(r, 400)


@pytest.mark.parametrize("messages", [None, []], ids=["missing", "empty"])
def test_missing_or_empty_messages_is_400(server: Server, messages: list | None) -> None:
    body = {"model": MODEL} if messages is None else {"model": MODEL, "messages": messages}
    with good_request_in_flight(server):
        r = post(server, CHAT, body)
    check_error(r, 400, param="messages")


# (field, bad value, param reported): each is a client mistake that must not reach the scheduler
BAD_FIELDS = [
    ("max_tokens", -1, "max_tokens"),
    ("max_tokens", 0, "max_tokens"),
    ("max_tokens", "5", "max_tokens"),
    ("temperature", -0.5, "temperature"),
    ("top_p", 0.0, "top_p"),
    ("top_p", 1.5, "top_p"),
    ("n", 0, "n"),
    ("frequency_penalty", 2.5, "frequency_penalty"),
    ("top_k", 0, "top_k"),
    ("logit_bias", {"49152": 1}, "logit_bias"),
    ("logit_bias", {"5": 101}, "logit_bias.5"),
    ("logit_bias", {"hello": 1}, "logit_bias"),
]


@pytest.mark.parametrize(("field", "value", "param"), BAD_FIELDS,
                         ids=[f"{f}={v}" for f, v, _ in BAD_FIELDS])
def test_bad_sampling_value_is_400_naming_the_parameter(server: Server, field: str, value: Any,
                                                         param: str) -> None:
    with good_request_in_flight(server):
        r = post(server, CHAT, {"model": MODEL, "messages": MSGS, field: value})
    check_error(r, 400, param=param)


def test_invalid_role_is_400(server: Server) -> None:
    with good_request_in_flight(server):
        r = post(server, CHAT, {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]})
    check_error(r, 400, param="messages[0].role")


def test_chat_template_refusal_is_400(server: Server) -> None:
    """A request's own template is a 400 on a server without --trust-request-chat-template (a template
    refusing the messages is a 400 on `messages`: tests/tokenizer_proc/test_http_errors.py)."""
    body = {"model": MODEL, "messages": MSGS,
            "chat_template_kwargs": {"chat_template": "{{ raise_exception('no such conversation') }}"}}
    with good_request_in_flight(server):
        r = post(server, CHAT, body)
    err = check_error(r, 400, param="chat_template_kwargs.chat_template")
    assert "--trust-request-chat-template" in err["message"]


def test_prompt_over_context_length_is_400(server: Server) -> None:
    with good_request_in_flight(server):
        r = post(server, "/v1/completions", {"model": MODEL, "prompt": [1] * 9000, "max_tokens": 4})
    check_error(r, 400, code="context_length_exceeded")


def test_unknown_route_is_404_and_wrong_method_405(server: Server) -> None:
    check_error(httpx.get(f"{server.base_url}/v1/nope", timeout=30), 404)
    check_error(httpx.get(f"{server.base_url}{CHAT}", timeout=30), 405)


@pytest.mark.parametrize("bias", [{"49152": 1.0}, {"5": 101.0}, {"x": 1.0}], ids=["oov", "value", "key"])
def test_generate_rejects_bad_logit_bias(server: Server, bias: dict) -> None:
    with good_request_in_flight(server):
        r = post(server, "/generate", {"text": "hi", "sampling_params": {"logit_bias": bias}})
    assert "logit_bias" in check_error(r, 400)["message"]
