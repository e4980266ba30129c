"""Chat and completions through the official openai client and raw SSE, against a fake scheduler."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson

from .conftest import REPLY, Scripts
from .fakes import Front, wait_for

MSGS = [{"role": "user", "content": "Say hello"}]


def client(fr: Front) -> openai.OpenAI:
    return openai.OpenAI(base_url=fr.base_url + "/v1", api_key="none", max_retries=0, timeout=30)


def _chat_prompt_len(tokenizer: Any, messages: list[dict]) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer.encode(text, add_special_tokens=False))


def sse_events(r: httpx.Response) -> list[Any]:
    """Parse an SSE body strictly: `data: ...` events separated by blank lines, ending with [DONE]."""
    body = r.text
    assert body.endswith("data: [DONE]\n\n"), body[-200:]
    events = body.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    payloads = [e[len("data: "):] for e in events]
    assert payloads[-1] == "[DONE]" and "[DONE]" not in payloads[:-1]
    return [orjson.loads(p) for p in payloads[:-1]]


def test_models(fr: Front) -> None:
    assert [m.id for m in client(fr).models.list().data] == [fr.served_model]
    assert fr.served_model == "SmolLM2-135M-Instruct"


def test_chat_non_stream(fr: Front, tokenizer: Any, front_scripts: Scripts) -> None:
    r = client(fr).chat.completions.create(model=fr.served_model, messages=MSGS, max_tokens=50,
                                            temperature=0.5, seed=7)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.content == REPLY
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "stop"
    n_out = len(front_scripts.ids())
    assert r.usage.prompt_tokens == _chat_prompt_len(tokenizer, MSGS)
    assert r.usage.completion_tokens == n_out
    assert r.usage.total_tokens == r.usage.prompt_tokens + n_out
    assert r.usage.prompt_tokens_details.cached_tokens == 3
    req = fr.sched.received[-1]
    assert req.input_ids.dtype.str == "<i4" and len(req.input_ids) == r.usage.prompt_tokens
    assert req.sampling["max_new_tokens"] == 50 and req.sampling["temperature"] == 0.5
    assert req.sampling["seed"] == 7 and req.stream is False


def test_chat_defaults_reach_the_scheduler(fr: Front) -> None:
    client(fr).chat.completions.create(model=fr.served_model, messages=MSGS)
    s = fr.sched.received[-1].sampling
    assert s["max_new_tokens"] is None and s["temperature"] == 1.0 and s["top_p"] == 1.0


def test_chat_length_finish(fr: Front) -> None:
    r = client(fr).chat.completions.create(model=fr.served_model, messages=MSGS, max_tokens=3)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


def test_chat_stream(fr: Front) -> None:
    chunks = list(client(fr).chat.completions.create(model=fr.served_model, messages=MSGS, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == REPLY
    reasons = [c.choices[0].finish_reason for c in chunks]
    assert reasons[-1] == "stop" and all(x is None for x in reasons[:-1])
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_chat_sse_framing(fr: Front) -> None:
    body = {"model": fr.served_model, "messages": MSGS, "stream": True}
    r = httpx.post(fr.base_url + "/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert all(isinstance(e["choices"], list) and len(e["choices"]) == 1 for e in events)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("\ufffd" not in e["choices"][0]["delta"].get("content", "") for e in events)


def test_stream_usage_chunk(fr: Front) -> None:
    body = {"model": fr.served_model, "messages": MSGS, "stream": True,
            "stream_options": {"include_usage": True}}
    events = sse_events(httpx.post(fr.base_url + "/v1/chat/completions", json=body))
    assert all(e["usage"] is None for e in events[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] > 0


def test_completions_non_stream_and_stream(fr: Front) -> None:
    c = client(fr)
    r = c.completions.create(model=fr.served_model, prompt="Once upon", max_tokens=64)
    assert r.object == "text_completion" and r.choices[0].text == REPLY
    assert fr.sched.received[-1].sampling["max_new_tokens"] == 64
    chunks = list(c.completions.create(model=fr.served_model, prompt="Once upon", max_tokens=64, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == REPLY
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completions_default_max_tokens_is_16(fr: Front) -> None:
    client(fr).completions.create(model=fr.served_model, prompt="x")
    assert fr.sched.received[-1].sampling["max_new_tokens"] == 16


def test_completions_prompt_forms(fr: Front, tokenizer: Any) -> None:
    c = client(fr)
    ids = tokenizer.encode("Hello", add_special_tokens=False)
    r = c.completions.create(model=fr.served_model, prompt=ids, max_tokens=64)
    assert r.choices[0].text == REPLY and list(fr.sched.received[-1].input_ids) == ids
    r = c.completions.create(model=fr.served_model, prompt=["a", "b c"], max_tokens=64)
    assert [ch.index for ch in r.choices] == [0, 1] and all(ch.text == REPLY for ch in r.choices)
    r = c.completions.create(model=fr.served_model, prompt=[ids, ids + ids], max_tokens=64)
    assert r.usage.prompt_tokens == 3 * len(ids)


def test_stop_string_split_across_tokens(fr: Front, front_scripts: Scripts, tokenizer: Any) -> None:
    front_scripts.text = "The answer is 42.<END> and then some more text that must not appear"
    front_scripts.finish = None  # the fake never finishes on its own: only the abort stops it
    fr.sched.interval_s = 0.002
    ids = front_scripts.ids()
    assert any("<" in tokenizer.decode([t]) and "END" not in tokenizer.decode([t]) for t in ids)
    r = client(fr).chat.completions.create(model=fr.served_model, messages=MSGS, stop=["<END>", "zzz"])
    assert r.choices[0].message.content == "The answer is 42."
    assert r.choices[0].finish_reason == "stop"
    rid = fr.sched.received[-1].rid
    assert wait_for(lambda: rid in fr.sched.aborted)
    body = {"model": fr.served_model, "prompt": "q", "stop": "<END>", "stream": True, "max_tokens": 100}
    events = sse_events(httpx.post(fr.base_url + "/v1/completions", json=body))
    pieces = [e["choices"][0]["text"] for e in events]
    assert "".join(pieces) == "The answer is 42."
    assert not any("<" in p for p in pieces)
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def test_stop_string_on_text_ending_exactly(fr: Front, front_scripts: Scripts) -> None:
    front_scripts.text = "abc STOP"
    r = client(fr).completions.create(model=fr.served_model, prompt="x", stop="STOP", max_tokens=64)
    assert r.choices[0].text == "abc " and r.choices[0].finish_reason == "stop"


def test_disconnect_aborts_stream(fr: Front, front_scripts: Scripts) -> None:
    front_scripts.finish = None
    front_scripts.ids_override = [28] * 10_000
    fr.sched.interval_s = 0.005
    body = {"model": fr.served_model, "messages": MSGS, "stream": True}
    with httpx.stream("POST", fr.base_url + "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
    rid = fr.sched.received[-1].rid
    assert wait_for(lambda: rid in fr.sched.aborted, 10)


def test_disconnect_aborts_non_stream(fr: Front, front_scripts: Scripts) -> None:
    front_scripts.finish = None
    front_scripts.ids_override = [28] * 10_000
    fr.sched.interval_s = 0.005
    body = {"model": fr.served_model, "messages": MSGS}
    try:
        httpx.post(fr.base_url + "/v1/chat/completions", json=body, timeout=0.5)
    except httpx.TimeoutException:
        pass
    assert wait_for(lambda: len(fr.sched.received) == 1 and fr.sched.received[0].rid in fr.sched.aborted, 10)


def test_control_routes(fr: Front) -> None:
    assert httpx.get(fr.base_url + "/health").status_code == 200
    info = httpx.get(fr.base_url + "/get_server_info").json()
    assert info["scheduler"]["num_running_reqs"] == 0 and info["context_length"] == 512
    assert httpx.post(fr.base_url + "/flush_cache").status_code == 200
    assert {"health", "get_server_info", "flush_cache"} <= set(fr.sched.controls)


def test_server_info_shows_the_settings_in_effect(fr: Front) -> None:
    """Where a flag said auto or nothing, /get_server_info shows what the worker resolved: an FP8
    checkpoint detected from its config reads quantization "fp8" without --quantization."""
    info = httpx.get(fr.base_url + "/get_server_info").json()
    assert info["quantization"] is None and info["attention_backend"] == "auto"
    fr.sched.worker_info = {"quantization": "fp8", "attention_backend": "sdpa", "device": "cpu"}
    try:
        info = httpx.get(fr.base_url + "/get_server_info").json()
    finally:
        fr.sched.worker_info = {}
    assert (info["quantization"], info["attention_backend"], info["device"]) == ("fp8", "sdpa", "cpu")
