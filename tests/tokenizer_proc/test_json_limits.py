"""JSON nesting bounds of the front end (tokenizer_proc/json_limits.py): a request body nested past
MAX_BODY_DEPTH is a 400 in each protocol's shape, tool schemas past MAX_JSON_DEPTH are refused
whatever tool_choice is, and JSON text inside a request or written by the model that nests too deeply
is kept as text instead of raising RecursionError (break-it pass of 2026-12-05: a 500 on
/v1/responses and /v1/messages, and a Responses stream cut without an event)."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import orjson
import pytest

from radixrt.constrained.spec import MAX_JSON_DEPTH, json_depth
from tokenizer_proc.json_limits import MAX_BODY_DEPTH, body_depth_error, loads_bounded
from tokenizer_proc.messages_writer import _input_object
from tokenizer_proc.tool_protocol import FunctionCall

from .fakes import Front


def _nested_list(levels: int) -> Any:
    v: Any = 1
    for _ in range(levels):
        v = [v]
    return v


def _nested_schema(levels: int) -> dict[str, Any]:
    """An object schema with `levels` object levels, each 2 JSON levels (the schema and its properties)."""
    v: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        v = {"type": "object", "properties": {"a": v}}
    return v


def test_json_depth_against_a_recursive_reference() -> None:
    def ref(v: Any) -> int:
        if isinstance(v, dict):
            return 1 + max(map(ref, v.values()), default=0)
        if isinstance(v, list):
            return 1 + max(map(ref, v), default=0)
        return 0

    rng = random.Random(0)

    def value(d: int) -> Any:
        if d == 0 or rng.random() < 0.2:
            return rng.choice([1, "x", None, 2.5, True])
        if rng.random() < 0.5:
            return [value(d - 1) for _ in range(rng.randint(0, 3))]
        return {str(i): value(d - 1) for i in range(rng.randint(0, 3))}

    for _ in range(2000):
        v = value(9)
        assert json_depth(v) == ref(v), v
    assert json_depth(_nested_list(900)) == 900


def test_body_depth_error_and_loads_bounded() -> None:
    ok = {"prompt": list(range(50_000)), "a": _nested_list(MAX_BODY_DEPTH - 1)}
    assert body_depth_error(ok, orjson.dumps(ok)) is None
    deep = {"a": _nested_list(MAX_BODY_DEPTH)}  # one more level than allowed
    assert body_depth_error(deep, orjson.dumps(deep)) == (
        f"request body nests {MAX_BODY_DEPTH + 1} levels deep; at most {MAX_BODY_DEPTH} are supported")
    assert loads_bounded('{"a": [1]}') == {"a": [1]}
    for text in ("[" * 5000 + "]" * 5000, json.dumps(_nested_list(MAX_JSON_DEPTH + 1)), "{no"):
        with pytest.raises(ValueError):
            loads_bounded(text)


def test_deep_json_text_stays_text() -> None:
    """An earlier call's arguments (chat / Responses history) and a call the model wrote."""
    deep = "[" * 5000 + "]" * 5000
    assert FunctionCall(name="f", arguments=deep).arguments_object() == deep
    assert FunctionCall(name="f", arguments='{"x": 1}').arguments_object() == {"x": 1}
    assert _input_object('{"a": ' + deep + "}") == {}
    assert _input_object('{"city": "Paris"}') == {"city": "Paris"}


def _post(fr: Front, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(fr.base_url + path, content=orjson.dumps(body), timeout=30,
                      headers={"content-type": "application/json"})


def test_deep_bodies_are_400s_in_each_protocol(fr: Front) -> None:
    deep = _nested_list(MAX_BODY_DEPTH + 10)
    user = [{"role": "user", "content": "hi"}]
    for path, body in [("/v1/chat/completions", {"messages": user, "metadata": deep}),
                       ("/v1/completions", {"prompt": "hi", "x": deep}),
                       ("/v1/responses", {"input": "hi", "metadata": {"a": deep}}),
                       ("/v1/messages", {"max_tokens": 4, "messages": [
                           {"role": "user", "content": "hi"},
                           {"role": "assistant", "content": [
                               {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": deep}}]},
                           {"role": "user", "content": [
                               {"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}]})]:
        r = _post(fr, path, {"model": fr.served_model, **body})
        assert r.status_code == 400, (path, r.text)
        err = r.json()["error"]
        assert "nests" in err["message"] and err["type"] == "invalid_request_error", (path, err)
        if path == "/v1/messages":
            assert r.json()["type"] == "error"
    ok = _post(fr, "/v1/chat/completions", {"model": fr.served_model, "messages": user, "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_deep_tool_schemas_are_400s_whatever_the_tool_choice(fr: Front) -> None:
    schema = _nested_schema(70)  # 141 levels
    user = [{"role": "user", "content": "hi"}]
    for choice in (None, "auto", "none"):
        extra = {} if choice is None else {"tool_choice": choice}
        cases = [("/v1/chat/completions", {"messages": user, **extra, "tools": [
                     {"type": "function", "function": {"name": "f", "parameters": schema}}]}, "tools"),
                 ("/v1/responses", {"input": "hi", **extra, "tools": [
                     {"type": "function", "name": "f", "parameters": schema}]}, "tools"),
                 ("/v1/messages", {"max_tokens": 4, "messages": user, "tools": [
                     {"name": "f", "input_schema": schema}]}, "tools")]
        for path, body, param in cases:
            if path == "/v1/messages" and choice is not None:
                body["tool_choice"] = {"type": "auto"} if choice == "auto" else {"type": "none"}
            r = _post(fr, path, {"model": fr.served_model, **body})
            assert r.status_code == 400, (path, choice, r.text)
            err = r.json()["error"]
            assert f"at most {MAX_JSON_DEPTH}" in err["message"], (path, err)
            assert param in (err.get("param") or err["message"]), (path, err)


@pytest.mark.parametrize("metadata", [{"a": {"b": "c"}}, {str(i): "v" for i in range(17)}, {"k" * 65: "v"},
                                      {"a": "v" * 513}, {"a": 1}])
def test_responses_metadata_follows_openai_limits(fr: Front, metadata: dict[str, Any]) -> None:
    r = _post(fr, "/v1/responses", {"model": fr.served_model, "input": "hi", "metadata": metadata})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "metadata", r.text
