"""Conformance of the server around the API: API keys, body limits, client disconnects, /metrics,
/health and the native /generate. The API-key tests use the session's
`keyed_server` (tests/conftest.py: `--api-key`, a small `--max-request-body-bytes`), which the
hostile-input tests share."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import KEYED_API_KEY, KEYED_BODY_LIMIT, Server
from tests.e2e.test_conformance import MODEL, client, good_request_in_flight

KEY = KEYED_API_KEY
BODY_LIMIT = KEYED_BODY_LIMIT
AUTH = {"Authorization": f"Bearer {KEY}"}
ROUTES = [
    ("GET", "/v1/models", None),
    ("GET", f"/v1/models/{MODEL}", None),
    ("POST", "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}),
    ("POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}}),
    ("POST", "/abort_request", {"rid": "none-in-flight"}),
    ("GET", "/get_server_info", None),
    ("POST", "/flush_cache", None),
    ("GET", "/metrics", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_api_key_required_on_every_route_but_health(keyed_server: Server, method: str, path: str,
                                                    body: dict | None) -> None:
    url = f"{keyed_server.base_url}{path}"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.request(method, url, json=body, headers=headers, timeout=60)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.request(method, url, json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text


def test_health_needs_no_api_key(keyed_server: Server) -> None:
    assert httpx.get(f"{keyed_server.base_url}/health", timeout=30).status_code == 200


def test_openai_client_with_and_without_the_key(keyed_server: Server) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(keyed_server, api_key="wrong").models.list()
    assert [m.id for m in client(keyed_server, api_key=KEY).models.list().data] == [MODEL]


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_oversized_body_is_413(keyed_server: Server, declared: bool) -> None:
    body = b'{"model": "%s", "prompt": "%s"}' % (MODEL.encode(), b"x" * BODY_LIMIT)

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 1000):
            yield body[i:i + 1000]

    with good_request_in_flight(keyed_server, headers=AUTH):
        r = httpx.post(f"{keyed_server.base_url}/v1/completions", content=body if declared else chunks(),
                       headers={**AUTH, "content-type": "application/json"}, timeout=30)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


# --------------------------------------------------------------------------- disconnects
def _scheduler(server: Server) -> dict:
    return httpx.get(f"{server.base_url}/get_server_info", timeout=30).json()["scheduler"]


def _wait_released(server: Server, timeout_s: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        s = _scheduler(server)
        if (s["num_running_reqs"], s["num_waiting_reqs"], s["num_protected_pages"]) == (0, 0, 0):
            return s
        assert time.monotonic() < deadline, f"pages not released after the client left: {s}"
        time.sleep(0.05)


LONG = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 1000, "temperature": 0, "ignore_eos": True, "n": 3}


def test_streamed_client_disconnect_aborts_all_samples(server: Server) -> None:
    _wait_released(server)
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json={**LONG, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(12):  # role chunks, then some content
            next(lines)
        assert _scheduler(server)["num_running_reqs"] == 3
    _wait_released(server)  # 3 x 1000 tokens would take far longer than the deadline


def test_non_streamed_client_disconnect_aborts_all_samples(server: Server) -> None:
    _wait_released(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/chat/completions", json=LONG, timeout=httpx.Timeout(60, read=1.5))
    _wait_released(server)
    assert "client disconnected before the response" in server.log()  # handled, not a 500
    assert "Exception in ASGI application" not in server.log()


# --------------------------------------------------------------------------- metrics, health, native
def _metrics(server: Server) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_parse_and_counters_move(server: Server) -> None:
    before = _metrics(server)
    r = client(server).completions.create(model=MODEL, prompt="Count to ten:", temperature=0, max_tokens=7,
                                          extra_body={"ignore_eos": True})
    after = _metrics(server)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert delta("radixrt_requests_total", outcome="ok") == 1
    assert delta("radixrt_generation_tokens_total") == 7
    assert delta("radixrt_prompt_tokens_total") == r.usage.prompt_tokens
    assert delta("radixrt_e2e_request_latency_seconds_count") == 1
    assert delta("radixrt_time_to_first_token_seconds_count") == 1
    assert after[("radixrt_scheduler_up", ())] == 1
    assert ("radixrt_num_running_reqs", ()) in after and ("radixrt_num_free_pages", ()) in after


def test_health_answers_200(server: Server) -> None:
    r = httpx.get(f"{server.base_url}/health", timeout=30)
    assert r.status_code == 200


def test_generate_returns_text_and_meta_info(server: Server) -> None:
    r = httpx.post(f"{server.base_url}/generate", json={
        "text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 6},
        "return_logprob": True}, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    meta = out["meta_info"]
    assert out["text"].startswith(" Paris") and len(out["output_ids"]) == meta["completion_tokens"]
    assert meta["prompt_tokens"] == 5 and meta["finish_reason"] in ("stop", "length")
    assert {"id", "cached_tokens", "matched_stop"} <= set(meta)
    assert [lp[1] for lp in meta["output_token_logprobs"]] == out["output_ids"]
