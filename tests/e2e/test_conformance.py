"""OpenAI conformance through a real server (session `server`, default model): sampling parameters.

One test per behaviour; each compares against a greedy or unpenalised run of the same prompt, so that
a parameter the server ignores makes the test fail. Other conformance files import the helpers here.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.conftest import Server

MODEL = "SmolLM2-135M-Instruct"
REPETITIVE = "The word hello repeated: hello hello hello hello"


def client(server: Server, api_key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=api_key, max_retries=0, timeout=120)


def complete(server: Server, prompt: str, **kw: Any) -> Any:
    """One greedy (unless told otherwise) /v1/completions choice."""
    kw.setdefault("temperature", 0)
    return client(server).completions.create(model=MODEL, prompt=prompt, **kw).choices[0]


def sse_events(server: Server, path: str, body: dict, headers: dict | None = None) -> list[dict]:
    """POST a streamed request; the decoded `data:` events, checking the stream ends with [DONE]."""
    with httpx.stream("POST", f"{server.base_url}{path}", json=body, headers=headers, timeout=120) as r:
        assert r.status_code == 200, r.read()
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert all(ln.startswith("data: ") for ln in lines)
    return [orjson.loads(ln[len("data: "):]) for ln in lines[:-1]]


@contextmanager
def good_request_in_flight(server: Server, headers: dict | None = None,
                           max_tokens: int = 12) -> Iterator[None]:
    """Run the body while a well-formed streamed request is generating; then check it completed."""
    started = threading.Event()
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "ignore_eos": True}

    def run() -> list[dict]:
        events = []
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, headers=headers,
                          timeout=120) as r:
            assert r.status_code == 200
            for ln in r.iter_lines():
                if ln.startswith("data: {"):
                    events.append(orjson.loads(ln[6:]))
                    started.set()
        return events

    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(run)
        assert started.wait(60) or fut.done(), "the good request did not start"
        yield
        events = fut.result(timeout=120)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(e["choices"][0]["text"] for e in events).strip()


# --------------------------------------------------------------------------- randomness
def test_seeded_sampling_is_independent_of_batch_companions(server: Server) -> None:
    kw = {"prompt": "Write a story about a dragon.", "temperature": 1.0, "seed": 1234, "max_tokens": 16,
          "extra_body": {"ignore_eos": True}}
    alone = complete(server, **kw).text
    assert alone.strip()
    companions = [{"prompt": f"Companion {i} says", "temperature": 0.9, "max_tokens": 40,
                   "extra_body": {"ignore_eos": True}} for i in range(3)]
    with cf.ThreadPoolExecutor(4) as ex:
        others = [ex.submit(complete, server, **c) for c in companions]
        together = ex.submit(complete, server, **kw).result().text
        [f.result() for f in others]
    assert together == alone
    assert complete(server, **{**kw, "seed": 4321}).text != alone  # the seed matters


def test_seeded_n_samples_differ_and_repeat(server: Server) -> None:
    """n > 1 with a seed: the choices are different samples, and the same request repeats them."""
    c = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=120)

    def texts() -> list[str]:
        r = c.completions.create(model=MODEL, prompt="Write a story about a dragon.", n=4, seed=7,
                                 temperature=1.0, max_tokens=12, extra_body={"ignore_eos": True})
        return [ch.text for ch in sorted(r.choices, key=lambda ch: ch.index)]

    first = texts()
    assert len(set(first)) >= 3
    assert texts() == first


def test_temperature_without_seed_varies(server: Server) -> None:
    texts = {complete(server, "Write a story about a dragon.", temperature=1.0, max_tokens=12).text
             for _ in range(4)}
    assert len(texts) >= 2


def test_top_k_one_equals_greedy(server: Server) -> None:
    greedy = complete(server, "My favourite animal is", max_tokens=16).text
    top1 = complete(server, "My favourite animal is", max_tokens=16, temperature=1.5, extra_body={"top_k": 1})
    assert top1.text == greedy


def test_min_p_one_equals_greedy(server: Server) -> None:
    greedy = complete(server, "My favourite animal is", max_tokens=16).text
    minp = complete(server, "My favourite animal is", max_tokens=16, temperature=1.5,
                    extra_body={"min_p": 1.0})
    assert minp.text == greedy


# --------------------------------------------------------------------------- logprobs
def test_chat_greedy_logprobs_top1_is_the_chosen_token(server: Server) -> None:
    r = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a fruit."}], temperature=0, max_tokens=8,
        logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0.0
        assert bytes(t.bytes) == t.token.encode()
        assert t.top_logprobs[0].token == t.token
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob, abs=1e-4)
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob


def test_completions_integer_logprobs_shape(server: Server) -> None:
    c = complete(server, "The capital of France is", max_tokens=6, logprobs=2)
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == c.text
    assert lp.text_offset == sorted(lp.text_offset)
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == 2 and top[tok] == pytest.approx(val, abs=1e-4)
        assert val == pytest.approx(max(top.values()), abs=1e-4)


def test_logprobs_survive_a_batch_with_requests_that_did_not_ask(server: Server) -> None:
    """A request asking for logprobs decodes in the same passes as one that does not (the streamed
    request in flight): it still gets one logprob per token, and the top rows it asked for. (The
    tokenizer process dropped the logprobs of every such mixed batch until 2026-12-02, found by a
    fresh-user test: the empty lists came back with status 200.)"""
    alone = complete(server, "The capital of France is", max_tokens=6, logprobs=2)
    with good_request_in_flight(server, max_tokens=64):
        mixed = complete(server, "The capital of France is", max_tokens=6, logprobs=2)
        chat = client(server).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Name a fruit."}], temperature=0, max_tokens=6,
            logprobs=True, top_logprobs=2)
    assert mixed.text == alone.text
    assert mixed.logprobs.tokens == alone.logprobs.tokens and len(mixed.logprobs.token_logprobs) == 6
    assert mixed.logprobs.token_logprobs == pytest.approx(alone.logprobs.token_logprobs, abs=1e-3)
    assert all(len(top) == 2 for top in mixed.logprobs.top_logprobs)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens > 0
    assert all(len(t.top_logprobs) == 2 for t in content)


# --------------------------------------------------------------------------- n, stops, lengths
def test_n_four_gives_four_indexed_choices(server: Server) -> None:
    r = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], n=4, temperature=1.0,
        max_tokens=6)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert all(c.finish_reason in ("stop", "length") and c.message.content for c in r.choices)
    assert r.usage.completion_tokens <= 4 * 6 and r.usage.completion_tokens >= 4


def test_n_four_streamed_gives_four_indexed_choices(server: Server) -> None:
    events = sse_events(server, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}], "n": 4,
        "temperature": 1.0, "max_tokens": 6, "stream": True})
    by_index: dict[int, list[dict]] = {}
    for e in events:
        assert len(e["choices"]) == 1
        by_index.setdefault(e["choices"][0]["index"], []).append(e["choices"][0])
    assert sorted(by_index) == [0, 1, 2, 3]
    for chunks in by_index.values():
        assert chunks[0]["delta"] == {"role": "assistant", "content": ""}
        assert [c["finish_reason"] is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
        assert "".join(c["delta"].get("content", "") for c in chunks)


def _boundary_stop(server: Server, prompt: str) -> tuple[str, str]:
    """(greedy text, a 4-character stop string that spans a token boundary inside it)."""
    c = complete(server, prompt, max_tokens=24, logprobs=0)
    toks = c.logprobs.tokens
    k = next(i for i in range(3, len(toks) - 1)
             if len(toks[i].strip()) >= 2 and len(toks[i + 1].strip()) >= 2)
    return c.text, toks[k][-2:] + toks[k + 1][:2]


def test_stop_string_split_over_tokens_never_leaks(server: Server) -> None:
    prompt = "The capital of France is"
    text, stop = _boundary_stop(server, prompt)
    want = text[:text.index(stop)]
    full = complete(server, prompt, max_tokens=24, stop=[stop])
    assert (full.text, full.finish_reason) == (want, "stop")
    events = sse_events(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 24,
                                                     "temperature": 0, "stop": stop, "stream": True})
    pieces = [e["choices"][0]["text"] for e in events]
    assert "".join(pieces) == want and stop not in "".join(pieces)
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def test_stop_token_ids(server: Server) -> None:
    g = httpx.post(f"{server.base_url}/generate", json={
        "text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 12}},
        timeout=60).json()
    ids = g["output_ids"]
    stop_id = ids[4]
    first = ids.index(stop_id)
    c = complete(server, "The capital of France is", max_tokens=12, extra_body={"stop_token_ids": [stop_id]})
    assert c.finish_reason == "stop" and c.matched_stop == stop_id
    r = client(server).completions.create(model=MODEL, prompt="The capital of France is", temperature=0,
                                          max_tokens=12, extra_body={"stop_token_ids": [stop_id]})
    assert r.usage.completion_tokens == first + 1


def test_ignore_eos_gives_exactly_max_tokens(server: Server) -> None:
    msgs = [{"role": "user", "content": "Say hi."}]
    c = client(server)
    natural = c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=48)
    assert natural.choices[0].finish_reason == "stop" and natural.usage.completion_tokens < 48
    forced = c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=48,
                                       extra_body={"ignore_eos": True})
    assert forced.choices[0].finish_reason == "length" and forced.usage.completion_tokens == 48


def test_max_completion_tokens_takes_precedence(server: Server) -> None:
    r = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a long story."}], temperature=0,
        max_tokens=40, max_completion_tokens=5)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"


def test_echo_prepends_the_prompt(server: Server) -> None:
    prompt = "The capital of France is"
    plain = complete(server, prompt, max_tokens=6).text
    echoed = complete(server, prompt, max_tokens=6, echo=True).text
    assert echoed == prompt + plain


# --------------------------------------------------------------------------- logit bias and penalties
def _token_id(model_dir: Any, text: str) -> int:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model_dir).encode(text, add_special_tokens=False)
    assert len(ids) == 1, ids
    return ids[0]


def test_logit_bias_plus_100_forces_a_token(server: Server, model_dir: Any) -> None:
    banana = _token_id(model_dir, " banana")
    c = complete(server, "The capital of France is", max_tokens=3, logit_bias={str(banana): 100})
    assert c.text == " banana" * 3


def test_logit_bias_minus_100_bans_a_token(server: Server, model_dir: Any) -> None:
    paris = _token_id(model_dir, " Paris")
    assert complete(server, "The capital of France is", max_tokens=4).text.startswith(" Paris")
    c = complete(server, "The capital of France is", max_tokens=4, logit_bias={str(paris): -100})
    assert not c.text.startswith(" Paris")


@pytest.mark.parametrize("penalty", [{"frequency_penalty": 1.5}, {"presence_penalty": 2.0},
                                     {"extra_body": {"repetition_penalty": 1.5}}])
def test_penalty_changes_greedy_output(server: Server, penalty: dict) -> None:
    base = complete(server, REPETITIVE, max_tokens=16).text
    assert base.count("hello") >= 12  # the unpenalised model keeps repeating
    penalised = complete(server, REPETITIVE, max_tokens=16, **penalty).text
    assert penalised.count("hello") < base.count("hello") // 2


def test_penalties_apply_on_the_native_api(server: Server) -> None:
    def gen(sp: dict) -> str:
        r = httpx.post(f"{server.base_url}/generate", json={
            "text": REPETITIVE, "sampling_params": {"temperature": 0, "max_new_tokens": 16, **sp}},
            timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["text"]

    assert gen({"frequency_penalty": 1.5}).count("hello") < gen({}).count("hello") // 2
