"""Error bodies: OpenAI shape, 400 (never 422/500) for client mistakes, 401/404/413/429."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .fakes import Front, start_front, wait_for

CHAT = "/v1/chat/completions"


def _chat(fr: Front, **over: Any) -> dict[str, Any]:
    body = {"model": fr.served_model, "messages": [{"role": "user", "content": "hi"}]}
    body.update(over)
    return body


def _err(r: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def test_bad_json_is_400(fr: Front) -> None:
    r = httpx.post(fr.base_url + CHAT, content=b"{not json", headers={"content-type": "application/json"})
    _err(r, 400)


@pytest.mark.parametrize("body", [b"[1, 2]", b"\"text\"", b"3", b"null", b""])
def test_non_object_json_is_400(fr: Front, body: bytes) -> None:
    r = httpx.post(fr.base_url + CHAT, content=body, headers={"content-type": "application/json"})
    _err(r, 400)


def test_missing_and_empty_messages(fr: Front) -> None:
    body = _chat(fr)
    del body["messages"]
    _err(httpx.post(fr.base_url + CHAT, json=body), 400, param="messages")
    _err(httpx.post(fr.base_url + CHAT, json=_chat(fr, messages=[])), 400, param="messages")


@pytest.mark.parametrize(("field", "value"), [
    ("max_tokens", -1), ("max_tokens", 0), ("max_tokens", "5"), ("max_completion_tokens", -3),
    ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("n", 0), ("top_logprobs", 50),
    ("stop", ""), ("stop", [1, 2]), ("stream", "yes"), ("presence_penalty", 3.0), ("top_k", 0),
    ("logit_bias", {"abc": 1}), ("seed", 1.5),
    # int() reads these as 5 (or fails: a 500); keys are ASCII digits only (break-it pass 3)
    ("logit_bias", {"\u0665": 1}), ("logit_bias", {"\u00b2": 1}), ("logit_bias", {"+5": 1}),
    ("logit_bias", {" 5": 1}),
    # float32 reads it as 0: positive logits / 0 = inf, NaN samples, token 0 six times (break-it, 12-05)
    ("repetition_penalty", 1e-300), ("repetition_penalty", 1e-40),
])
def test_bad_parameter_names_param(fr: Front, field: str, value: Any) -> None:
    err = _err(httpx.post(fr.base_url + CHAT, json=_chat(fr, **{field: value})), 400, param=field)
    assert field in err["message"]


def test_bad_message_names_path(fr: Front) -> None:
    r = httpx.post(fr.base_url + CHAT, json=_chat(fr, messages=[{"role": "user", "content": 5}]))
    err = _err(r, 400)
    assert err["param"].startswith("messages[0]")
    r = httpx.post(fr.base_url + CHAT, json=_chat(fr, messages=[{"role": "wizard", "content": "x"}]))
    _err(r, 400, param="messages[0].role")


def test_logit_bias_key_with_leading_zeros_is_the_token(fr: Front) -> None:
    body = {"model": fr.served_model, "prompt": "hi", "max_tokens": 2, "logit_bias": {"05": 3}}
    assert httpx.post(fr.base_url + "/v1/completions", json=body).status_code == 200
    assert fr.sched.received[-1].sampling["logit_bias"] == {"05": 3}


def test_image_part_is_named_as_unsupported(fr: Front) -> None:
    """An image part is a 400 on the part saying images are not supported (break-it pass 3: "Input
    should be a valid string", about the whole content)."""
    content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    r = httpx.post(fr.base_url + CHAT, json=_chat(fr, messages=[{"role": "user", "content": content}]))
    err = _err(r, 400, param="messages[0].content[1].type")
    assert "not supported" in err["message"] and "'image_url'" in err["message"], err
    missing = [{"type": "text"}]
    r = httpx.post(fr.base_url + CHAT, json=_chat(fr, messages=[{"role": "user", "content": missing}]))
    _err(r, 400, param="messages[0].content[0].text")
    r = httpx.post(fr.base_url + CHAT, json=_chat(fr, messages=[{"role": "user", "content": content[:1]}]))
    assert r.status_code == 200, r.text


def test_completions_bad_prompt(fr: Front) -> None:
    base = {"model": fr.served_model}
    for prompt in ([], [[]], [-1], 5, [1.5]):
        _err(httpx.post(fr.base_url + "/v1/completions", json={**base, "prompt": prompt}), 400)
    _err(httpx.post(fr.base_url + "/v1/completions", json={**base, "prompt": [10 ** 9]}), 400, param="prompt")
    _err(httpx.post(fr.base_url + "/v1/completions", json=base), 400, param="prompt")


def test_unknown_model_is_404(fr: Front) -> None:
    err = _err(httpx.post(fr.base_url + CHAT, json=_chat(fr, model="gpt-9")), 404, code="model_not_found")
    assert fr.served_model in err["message"]
    _err(httpx.get(fr.base_url + "/v1/models/gpt-9"), 404, code="model_not_found")


def test_unknown_route_and_method(fr: Front) -> None:
    _err(httpx.get(fr.base_url + "/v1/nothing"), 404)
    _err(httpx.get(fr.base_url + CHAT), 405)


def test_oversized_body_is_413(fr: Front) -> None:
    big = "x" * (fr.args.max_request_body_bytes + 10)
    _err(httpx.post(fr.base_url + CHAT, json=_chat(fr, messages=[{"role": "user", "content": big}])), 413)

    def chunks():  # no content-length: the cap applies while reading
        for _ in range(100):
            yield b"x" * 1024

    _err(httpx.post(fr.base_url + CHAT, content=chunks()), 413)


def test_context_length_exceeded(fr: Front) -> None:
    long = "word " * 2000
    r = httpx.post(fr.base_url + CHAT, json=_chat(fr, messages=[{"role": "user", "content": long}]))
    _err(r, 400, code="context_length_exceeded")
    assert not fr.sched.received


def test_scheduler_rejection_maps_to_status(fr: Front) -> None:
    fr.sched.error = "too many queued requests"
    for r in (httpx.post(fr.base_url + CHAT, json=_chat(fr)),
              httpx.post(fr.base_url + CHAT, json=_chat(fr, stream=True))):
        _err(r, 429)
        assert r.headers.get("retry-after") == "1"  # the SDKs' retries wait that long (break-it, 12-05)
    body = {"model": fr.served_model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(fr.base_url + "/v1/messages", json=body)
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    assert r.headers.get("retry-after") == "1"
    fr.sched.error = "prompt rejected"
    _err(httpx.post(fr.base_url + "/v1/completions", json={"model": fr.served_model, "prompt": "x"}), 400)


def test_errors_do_not_disturb_the_server(fr: Front) -> None:
    for _ in range(3):
        httpx.post(fr.base_url + CHAT, content=b"{")
    r = httpx.post(fr.base_url + CHAT, json=_chat(fr))
    assert r.status_code == 200


@pytest.fixture(scope="module")
def keyed(tokenizer: Any, tok_model_dir: Any) -> Any:
    f = start_front(tokenizer, tok_model_dir, lambda req: ([42], "stop"), api_key="sekret")
    yield f
    f.stop()


def test_api_key(keyed: Front) -> None:
    url = keyed.base_url
    _err(httpx.get(url + "/v1/models"), 401)
    _err(httpx.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
    _err(httpx.post(url + CHAT, json={}, headers={"Authorization": "sekret"}), 401)
    _err(httpx.get(url + "/metrics"), 401)
    ok = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer sekret"})
    assert ok.status_code == 200
    for auth in ("bearer sekret", "BEARER sekret"):  # the scheme is case-insensitive (RFC 7235)
        assert httpx.get(url + "/v1/models", headers={"Authorization": auth}).status_code == 200
    for auth in ("Bearer  sekret", "Basic sekret", "Bearersekret", "Bearer sekret2"):
        _err(httpx.get(url + "/v1/models", headers={"Authorization": auth}), 401)
    assert httpx.head(url + "/health").status_code == 200
    assert httpx.get(url + "/health").status_code == 200
    info = httpx.get(url + "/get_server_info", headers={"Authorization": "Bearer sekret"}).json()
    assert info["api_key"] == "***" and "sekret" not in str(info)


@pytest.mark.parametrize(("prompt", "where"), [
    ([[1, 2], 3], "prompt[1]"), ([1, [2]], "prompt[1]"), ([-1, 2], "negative"), ([[1, -2]], "prompt[0][1]"),
    ([[[1]]], "nest at most two levels"), ([1.5, 2], "1.5"), ([[1.0]], "prompt[0][0]"), ([], "empty"),
    ([[]], "prompt[0]: empty"), ([1, "a"], "prompt[1]"), (["a", 1], "prompt[1]"), ([True, 2], "boolean"),
    (None, "got null"), ({"a": 1}, "object"), ([1, None], "prompt[1]"),
])
def test_malformed_token_prompt_names_the_problem(fr: Front, prompt: Any, where: str) -> None:
    body = {"model": fr.served_model, "prompt": prompt, "max_tokens": 2}
    err = _err(httpx.post(fr.base_url + "/v1/completions", json=body), 400, param="prompt")
    assert where in err["message"], err


def test_path_named_errors_set_param(fr: Front) -> None:
    """Errors whose message starts with a path set `param` to it; /generate's logit_bias values are
    checked in the front end, as chat's are (both were 400s with `param: null`; break-it, 2026-12-05)."""
    msgs = [{"role": "tool", "tool_call_id": "a", "content": "x"}]
    err = _err(httpx.post(fr.base_url + CHAT, json=_chat(fr, messages=msgs)), 400,
               param="messages[0].tool_call_id")
    assert "answers no tool call" in err["message"]
    n = len(fr.sched.received)
    body = {"text": "hi", "sampling_params": {"logit_bias": {"5": 1000}}}
    err = _err(httpx.post(fr.base_url + "/generate", json=body), 400, param="sampling_params.logit_bias")
    assert "[-100, 100]" in err["message"]
    assert len(fr.sched.received) == n


def test_malformed_input_ids_in_generate(fr: Front) -> None:
    r = httpx.post(fr.base_url + "/generate", json={"input_ids": [[1, 2], [3, "x"]]})
    err = _err(r, 400, param="input_ids")
    assert "input_ids[1][1]" in err["message"], err
    err = _err(httpx.post(fr.base_url + "/generate", json={"input_ids": [5, -7]}), 400, param="input_ids")
    assert "-7" in err["message"], err


def _rejected_count(fr: Front) -> float:
    for line in httpx.get(fr.base_url + "/metrics").text.splitlines():
        if line.startswith('radixrt_requests_total{outcome="rejected"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_more_samples_than_the_server_ever_takes_is_400_not_429(fr: Front) -> None:
    """prompts x n above --max-running-requests + --max-queued-requests can never be admitted:
    a 400 naming the limit, not a 429 inviting a retry; counted as a rejected request."""
    before = _rejected_count(fr)
    body = {"model": fr.served_model, "prompt": [[5]] * 5000, "max_tokens": 1}
    _err(httpx.post(fr.base_url + "/v1/completions", json=body), 400, param="n")
    assert not fr.sched.received
    assert _rejected_count(fr) == before + 1


def test_front_end_429_when_full_is_counted_as_rejected(tokenizer: Any, tok_model_dir: Any) -> None:
    """With --max-running-requests 1 and --max-queued-requests 1 the front end tracks 2 samples: a
    third request gets 429 before it reaches the scheduler, and /metrics counts it as rejected."""
    import threading

    f = start_front(tokenizer, tok_model_dir, lambda req: ([28] * 10_000, None), max_running_requests=1,
                    max_queued_requests=1)
    f.sched.interval_s = 0.01
    try:
        body = {"model": f.served_model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}

        def hold() -> None:  # two requests that stay in flight until the front stops
            try:
                httpx.post(f.base_url + CHAT, json=body, timeout=20)
            except httpx.HTTPError:
                pass

        for _ in range(2):
            threading.Thread(target=hold, daemon=True).start()
        assert wait_for(lambda: len(f.sched.received) == 2)
        before = _rejected_count(f)
        _err(httpx.post(f.base_url + CHAT, json=body), 429)
        assert len(f.sched.received) == 2  # refused in the front end
        assert _rejected_count(f) == before + 1
    finally:
        f.stop()


@pytest.mark.parametrize(("path", "extra"), [
    (CHAT, {"top_k": 10**12}),
    ("/v1/messages", {"top_k": 3_000_000_000, "max_tokens": 4}),
    ("/generate", {"text": "hi", "sampling_params": {"top_k": 2**31, "max_new_tokens": 2}}),
])
def test_top_k_past_int32_means_off(fr: Front, path: str, extra: dict[str, Any]) -> None:
    """A top_k larger than any vocabulary keeps every token, as -1 does; it reached the scheduler's int32
    batch arrays as it was and took the server down (OverflowError; break-it, 2026-12-05)."""
    body = _chat(fr) if path != "/generate" else {}
    body.update(extra)
    if path == "/generate":
        body.pop("model", None)
    n = len(fr.sched.received)
    r = httpx.post(fr.base_url + path, json=body)
    assert r.status_code == 200, r.text
    assert [q.sampling["top_k"] for q in fr.sched.received[n:]] == [-1]


def test_a_request_chat_template_needs_the_flag(fr: Front, tokenizer: Any, tok_model_dir: Any) -> None:
    """`chat_template_kwargs.chat_template` is code from the client (a short one can render a prompt
    of any size in the front end; break-it, 2026-12-05): 400 unless the server
    runs with --trust-request-chat-template (vLLM's flag), and then it is the template used."""
    tmpl = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"
    body = _chat(fr, chat_template_kwargs={"chat_template": tmpl}, max_tokens=2)
    n = len(fr.sched.received)
    err = _err(httpx.post(fr.base_url + CHAT, json=body), 400, param="chat_template_kwargs.chat_template")
    assert "--trust-request-chat-template" in err["message"]
    assert len(fr.sched.received) == n
    trusted = start_front(tokenizer, tok_model_dir, lambda req: ([42], "stop"),
                          trust_request_chat_template=True)
    try:
        body["model"] = trusted.served_model
        assert httpx.post(trusted.base_url + CHAT, json=body).status_code == 200
        ids = trusted.sched.received[-1].input_ids.tolist()
        assert ids == tokenizer("<<hi>>", add_special_tokens=False)["input_ids"]
        body["chat_template_kwargs"] = {"chat_template": "{{ raise_exception('no such conversation') }}"}
        err = _err(httpx.post(trusted.base_url + CHAT, json=body), 400, param="messages")
        assert "no such conversation" in err["message"]
    finally:
        trusted.stop()


def test_a_body_that_stops_arriving_gets_408(fr: Front, monkeypatch: pytest.MonkeyPatch) -> None:
    """No body bytes for BODY_IDLE_TIMEOUT_S: 408 and the connection closed (it was held open with
    no answer; break-it, 2026-12-05); a slow but steady body is still read; the server goes on."""
    import socket
    import time

    from radixrt.tokenizer_proc import http_io

    monkeypatch.setattr(http_io, "BODY_IDLE_TIMEOUT_S", 0.5)
    host, port = fr.base_url.removeprefix("http://").split(":")
    body = httpx.Request("POST", "/", json=_chat(fr, max_tokens=2)).content
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head + body[:9])
        reply = s.recv(65536).decode()  # within the socket's 10 s timeout
        assert reply.startswith("HTTP/1.1 408"), reply
        assert "stopped arriving" in reply
    with socket.create_connection((host, int(port)), timeout=10) as s:  # 0.2 s between pieces
        s.sendall(head)
        step = len(body) // 4 + 1
        for i in range(0, len(body), step):
            time.sleep(0.2)
            s.sendall(body[i:i + step])
        assert s.recv(65536).decode().startswith("HTTP/1.1 200")
    assert httpx.post(fr.base_url + CHAT, json=_chat(fr)).status_code == 200


def test_generate_rid_names_the_reply_and_abort_request_stops_it(fr: Front) -> None:
    """SGLang's `rid`: the reply's `meta_info.id`, one per prompt of a batch, unique among requests in
    flight; POST /abort_request {"rid"} ends that request with finish_reason "abort" (the id was
    ignored and there was no abort route; break-it, 2026-12-05)."""
    import threading
    import time

    url = fr.base_url
    one = httpx.post(url + "/generate", json={"text": "hi", "rid": "my-1"}).json()
    assert one["meta_info"]["id"] == "my-1"
    two = httpx.post(url + "/generate", json={"text": ["a", "b"], "rid": ["x-1", "x-2"]}).json()
    assert [r["meta_info"]["id"] for r in two] == ["x-1", "x-2"]
    for bad in ({"text": ["a", "b"], "rid": "x"}, {"text": "a", "rid": ["x"]}, {"text": "a", "rid": ""},
                {"text": ["a", "b"], "rid": ["x", "x"]}, {"text": ["a", "b"], "rid": ["x"]}):
        _err(httpx.post(url + "/generate", json=bad), 400, param="rid")
    never = httpx.post(url + "/abort_request", json={"rid": "never"}).json()
    assert never == {"rid": "never", "aborted": False}
    _err(httpx.post(url + "/abort_request", json={"rid": 5}), 400, param="rid")

    fr.sched.interval_s = 0.05  # the scripted reply (14 tokens) takes ~0.7 s
    replies: list[httpx.Response] = []
    try:
        t = threading.Thread(target=lambda: replies.append(httpx.post(
            url + "/generate", json={"text": "hi", "rid": "slow-1"}, timeout=30)))
        n = len(fr.sched.received)
        t.start()
        deadline = time.monotonic() + 10
        while len(fr.sched.received) == n:  # until the scheduler has it
            assert time.monotonic() < deadline
            time.sleep(0.01)
        _err(httpx.post(url + "/generate", json={"text": "hi", "rid": "slow-1"}), 400, param="rid")
        assert httpx.post(url + "/abort_request", json={"rid": "slow-1"}).json()["aborted"]
        t.join(10)
    finally:
        fr.sched.interval_s = 0.0
    meta = replies[0].json()["meta_info"]
    assert replies[0].status_code == 200 and meta["id"] == "slow-1" and meta["finish_reason"] == "abort"
    assert meta["completion_tokens"] < 14
    assert fr.sched.aborted[-1] == fr.sched.received[-1].rid  # the scheduler was told
    assert httpx.post(url + "/generate", json={"text": "hi", "rid": "slow-1"}).status_code == 200  # reusable
