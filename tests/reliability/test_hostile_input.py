"""Hostile input and tenants on one keyed server (`--api-key`, `--request-timeout 6`): schemathesis
fuzzes every route of /openapi.json with and without the key (zero 5xx, every error an OpenAI error
body); an oversized body gets a 413 the client can read; no info route or log line carries the key;
cache_salt keeps tenants' prefixes apart."""

from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from bench.server_proc import Server
from tests.conftest import KEYED_API_KEY

schemathesis = pytest.importorskip("schemathesis")  # a test extra; absent on the GPU machine

KEY = KEYED_API_KEY
AUTH = {"authorization": f"Bearer {KEY}"}
MODEL = "SmolLM2-135M-Instruct"
MAX_EXAMPLES = 12  # per route and method: bounded for CI
# route -> the error shape it answers with (the Anthropic route another change adds uses Anthropic's)
ERROR_SHAPE = {"/v1/messages": "anthropic"}


@pytest.fixture
def keyed(keyed_server: Server) -> Server:
    """The session's keyed server (tests/conftest.py), shared with tests/e2e/test_conformance_server.py."""
    return keyed_server


def error_body_problem(path: str, status: int, content: bytes) -> str | None:
    """None if content is the error body the route promises (OpenAI's unless ERROR_SHAPE says)."""
    try:
        body = orjson.loads(content)
        if ERROR_SHAPE.get(path) == "anthropic":
            ok = body["type"] == "error" and isinstance(body["error"]["message"], str)
        else:
            ok = isinstance(body["error"]["message"], str) and isinstance(body["error"]["type"], str)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        ok = False
    return None if ok else f"{path}: {status} without an error body: {content[:200]!r}"


def _fuzz(server: Server, headers: dict[str, str], expect_401: bool) -> list[str]:
    spec = httpx.get(server.base_url + "/openapi.json", headers=AUTH, timeout=30).json()
    schema = schemathesis.openapi.from_dict(spec)
    problems: list[str] = []
    seen: set[str] = set()
    for result in schema.get_all_operations():
        op = result.ok()
        seen.add(f"{op.method.upper()} {op.path}")

        _fuzz_operation(server, op, headers, expect_401, problems)
    assert {"POST /v1/chat/completions", "POST /v1/completions", "POST /generate", "GET /v1/models"} <= seen
    return problems


def _fuzz_operation(server: Server, op: Any, headers: dict[str, str], expect_401: bool,
                    problems: list[str]) -> None:
    """MAX_EXAMPLES schemathesis cases of one operation; what goes wrong is appended to problems."""

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy())
    def run(case: Any) -> None:
        r = case.call(base_url=server.base_url, headers=headers, timeout=60)
        status = r.status_code
        if status >= 500 or (expect_401 and status != 401 and op.path != "/health"):  # /health is open
            problems.append(f"{op.method.upper()} {op.path}: {status} for {case.body!r:.200}")
        elif status >= 400:
            problem = error_body_problem(op.path, status, r.content)
            if problem:
                problems.append(problem)

    run()


def test_fuzz_every_route_with_the_key(keyed: Server) -> None:
    assert _fuzz(keyed, AUTH, expect_401=False) == []
    assert httpx.get(keyed.base_url + "/health", timeout=30).status_code == 200


def test_fuzz_every_route_without_the_key(keyed: Server) -> None:
    assert _fuzz(keyed, {}, expect_401=True) == []
    assert _fuzz(keyed, {"authorization": "Bearer " + KEY[:-1]}, expect_401=True) == []


def test_openapi_names_the_request_bodies(keyed: Server) -> None:
    assert httpx.get(keyed.base_url + "/openapi.json", timeout=30).status_code == 401
    spec = httpx.get(keyed.base_url + "/openapi.json", headers=AUTH, timeout=30).json()
    body = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    ref = body["schema"]["$ref"].rsplit("/", 1)[-1]
    props = spec["components"]["schemas"][ref]["properties"]
    assert {"messages", "model", "cache_salt", "response_format"} <= set(props)


def test_oversized_body_gets_a_readable_413(keyed: Server) -> None:
    big = b'{"model": "x", "prompt": "' + b"a" * (4 * 1024 * 1024) + b'"}'
    for headers in ({}, {"transfer-encoding": "chunked"}):
        content: Any = big if not headers else iter([big[i:i + 65536] for i in range(0, len(big), 65536)])
        r = httpx.post(keyed.base_url + "/v1/completions", content=content,
                       headers={**AUTH, "content-type": "application/json", **headers}, timeout=60)
        assert r.status_code == 413, r.text
        assert error_body_problem("/v1/completions", 413, r.content) is None
    assert httpx.get(keyed.base_url + "/health", timeout=30).status_code == 200  # still serving


def test_request_timeout_ends_a_long_request_with_408(keyed: Server) -> None:
    """A plain and a streamed request, sent together (one --request-timeout of the server's time,
    not two), each past the timeout."""
    body = {"model": MODEL, "prompt": "count:", "max_tokens": 4000, "ignore_eos": True}

    def streamed() -> list[str]:
        with httpx.stream("POST", keyed.base_url + "/v1/completions", json={**body, "stream": True},
                          headers=AUTH, timeout=60) as s:
            return [ln for ln in s.iter_lines() if ln]

    with cf.ThreadPoolExecutor(1) as ex:
        lines_future = ex.submit(streamed)
        r = httpx.post(keyed.base_url + "/v1/completions", json=body, headers=AUTH, timeout=60)
        lines = lines_future.result(timeout=60)
    assert r.status_code == 408 and r.json()["error"]["type"] == "timeout_error", r.text
    assert lines[-1] == "data: [DONE]"
    assert orjson.loads(lines[-2].removeprefix("data: "))["error"]["type"] == "timeout_error"
    # the 408 aborted both in the scheduler: they stop decoding (4,000 tokens each otherwise)
    deadline = time.monotonic() + 30
    while (sched := _scheduler_info(keyed))["num_running_reqs"] + sched["num_waiting_reqs"]:
        assert time.monotonic() < deadline, sched
        time.sleep(0.2)


def _scheduler_info(s: Server) -> dict[str, Any]:
    return httpx.get(s.base_url + "/get_server_info", headers=AUTH, timeout=30).json()["scheduler"]


def test_no_secret_in_info_routes_or_logs(keyed: Server) -> None:
    for path in ("/get_server_info", "/v1/models", "/metrics", "/openapi.json", "/health"):
        r = httpx.get(keyed.base_url + path, headers=AUTH, timeout=30)
        assert r.status_code == 200, path
        assert KEY not in r.text and KEY[4:] not in r.text, path
    httpx.get(keyed.base_url + "/v1/models", headers={"authorization": "Bearer wrong-" + KEY}, timeout=30)
    assert KEY not in keyed.log()


def _cached(server: Server, prompt: str, salt: str | None) -> int:
    body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    r = httpx.post(server.base_url + "/v1/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_cache_salt_isolates_tenants(keyed: Server) -> None:
    prompt = "tenant isolation check: " + " ".join(f"w{i}" for i in range(60))
    assert _cached(keyed, prompt, "tenant-a") == 0
    assert _cached(keyed, prompt, "tenant-b") == 0  # same prompt, other salt: no KV shared
    assert _cached(keyed, prompt, None) == 0  # nor with unsalted requests
    assert _cached(keyed, prompt, "tenant-a") > 16  # same salt shares
    assert _cached(keyed, prompt, None) > 16
    r = httpx.post(keyed.base_url + "/generate", headers=AUTH, timeout=120, json={
        "text": prompt, "cache_salt": "tenant-c", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200 and r.json()["meta_info"]["cached_tokens"] == 0
    bad = httpx.post(keyed.base_url + "/v1/completions", headers=AUTH, timeout=30,
                     json={"model": MODEL, "prompt": "x", "cache_salt": ""})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"
