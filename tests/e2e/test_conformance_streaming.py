"""OpenAI conformance through a real server: the shape of SSE streams and multi-byte text."""

from __future__ import annotations

import pytest

from tests.conftest import Server
from tests.e2e.test_conformance import MODEL, client, sse_events

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0, "max_tokens": 10}
COMPLETION = {"model": MODEL, "prompt": "The three primary colours are", "temperature": 0, "max_tokens": 10}
ROUTES = [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)]


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=["chat", "completions"])
def test_every_chunk_has_choices_and_finish_reason_only_last(server: Server, path: str, body: dict) -> None:
    events = sse_events(server, path, {**body, "stream": True})
    assert len(events) >= 3
    for e in events:
        assert isinstance(e["choices"], list) and len(e["choices"]) == 1
        assert "usage" not in e  # only with stream_options.include_usage
    reasons = [e["choices"][0]["finish_reason"] for e in events]
    assert all(r is None for r in reasons[:-1]) and reasons[-1] in ("stop", "length")
    assert len({e["id"] for e in events}) == 1


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=["chat", "completions"])
def test_include_usage_adds_one_final_usage_chunk(server: Server, path: str, body: dict) -> None:
    events = sse_events(server, path, {**body, "stream": True, "stream_options": {"include_usage": True}})
    *content, last = events
    assert last["choices"] == [] and last["usage"]["completion_tokens"] >= 1
    u = last["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert all(e["usage"] is None and len(e["choices"]) == 1 for e in content)
    full = client(server).completions.create(**COMPLETION) if path == "/v1/completions" else \
        client(server).chat.completions.create(**CHAT)
    assert u["completion_tokens"] == full.usage.completion_tokens
    assert u["prompt_tokens"] == full.usage.prompt_tokens


def _stream_text(events: list[dict]) -> str:
    out = []
    for e in events:
        ch = e["choices"][0]
        out.append(ch["text"] if "text" in ch else ch["delta"].get("content", ""))
    return "".join(out)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hello in Chinese."}]}),
    ("/v1/completions", {"prompt": "用中文写一句话：今天天气"}),
], ids=["chat", "completions"])
def test_multibyte_text_streams_without_broken_characters(server: Server, path: str, body: dict) -> None:
    """Characters split over tokens are held back until whole. Only a max_tokens cut inside a
    character leaves a final U+FFFD; 16 tokens cut the chat answer that way."""
    req = {"model": MODEL, "temperature": 0, "max_tokens": 16, **body}
    c = client(server)
    if path == "/v1/completions":
        choice = c.completions.create(**req).choices[0]
        text = choice.text
    else:
        choice = c.chat.completions.create(**req).choices[0]
        text = choice.message.content
    assert any("\u4e00" <= ch <= "\u9fff" for ch in text), f"expected Chinese text, got {text!r}"
    whole = text[:-1] if choice.finish_reason == "length" and text.endswith("\ufffd") else text
    assert "\ufffd" not in whole
    events = sse_events(server, path, {**req, "stream": True})
    pieces = [_stream_text([e]) for e in events]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces[:-2])  # the finish chunk and the flushed tail
    assert sum(p.count("\ufffd") for p in pieces) == text.count("\ufffd")
