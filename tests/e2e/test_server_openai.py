"""End to end: a real server on the default model, driven by the official `openai` client."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import Server

MODEL = "SmolLM2-135M-Instruct"


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=120)


def test_models_lists_the_served_model(server: Server) -> None:
    ids = [m.id for m in client(server).models.list().data]
    assert ids == [MODEL]


def test_chat_streamed_equals_non_streamed(server: Server) -> None:
    c = client(server)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    full = c.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=24)
    text = full.choices[0].message.content
    assert text and "Paris" in text
    assert full.usage.completion_tokens <= 24 and full.usage.prompt_tokens > 10
    chunks = list(c.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                            max_tokens=24, stream=True))
    joined = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert joined == text
    reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert reasons[-1] in ("stop", "length") and all(r is None for r in reasons[:-1])


def test_completions_streamed_equals_non_streamed(server: Server) -> None:
    c = client(server)
    prompt = "The three primary colours are"
    full = c.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=16)
    text = full.choices[0].text
    assert text.strip()
    assert full.usage.completion_tokens == 16 or full.choices[0].finish_reason == "stop"
    chunks = list(c.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=16,
                                       stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == text


def test_stream_ends_with_done(server: Server) -> None:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert r.status_code == 200
    assert lines[-1] == "data: [DONE]"
    assert all(ln.startswith("data: ") for ln in lines)


def test_sixteen_concurrent_requests_match_solo_runs(server: Server) -> None:
    """Continuous batching: requests that join and leave mid-flight get their solo outputs."""
    c = client(server)
    prompts = [("Count: " + "one two three " * (i * 3)).strip() for i in range(16)]
    lens = [4 + (i * 5) % 23 for i in range(16)]

    def run(i: int) -> str:
        r = c.completions.create(model=MODEL, prompt=prompts[i], temperature=0, max_tokens=lens[i])
        return r.choices[0].text

    with cf.ThreadPoolExecutor(16) as ex:
        together = list(ex.map(run, range(16)))
    solo = [run(i) for i in (0, 7, 15)]
    assert [together[i] for i in (0, 7, 15)] == solo
    assert all(t for t in together)


# A SIGKILLed worker ending the server: tests/reliability/test_faults.py (under load, same checks).
# SIGTERM stopping an idle server cleanly (exit 0, no child left): the teardown of the session's
# `server` and `keyed_server` fixtures (tests/conftest.py, stop_cleanly), without a server of its own.


def test_missing_model_exits_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "radixrt.cli", "launch-server", "--model-path",
                        str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "error" in err[0].lower()
    assert "Traceback" not in r.stderr


def test_busy_port_fails_fast_with_one_line(tmp_path: Path) -> None:
    """A port in use is reported before the model is loaded: exit 2, one line, no traceback."""
    import socket
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "radixrt.cli", "launch-server", "--port", str(port),
                            "--model-path", str(tmp_path / "nope")],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and time.monotonic() - t0 < 30
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and f"127.0.0.1:{port}" in err[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("bad", [{"messages": []}, {"messages": "hi"}, {"max_tokens": -1}])
def test_bad_chat_requests_get_400(server: Server, bad: dict) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **bad}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400
    assert "error" in r.json() and r.json()["error"]["message"]


def test_return_token_ids_counts_match_usage(server: Server) -> None:
    """vLLM's `return_token_ids`: streamed ids add up to usage.completion_tokens, and equal the
    non-streamed ids (so benchmarks can count tokens and replay multi-turn answers exactly)."""
    body = {"model": MODEL, "prompt": "Write a haiku about the sea.", "max_tokens": 12, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    full = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()
    want = full["choices"][0]["token_ids"]
    assert len(want) == full["usage"]["completion_tokens"] == 12
    ids: list[int] = []
    usage = None
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=stream_body, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[len("data: "):])
            for ch in obj["choices"]:
                ids.extend(ch.get("token_ids", []))
            usage = obj.get("usage") or usage
    assert ids == want
    assert usage["completion_tokens"] == len(ids)
