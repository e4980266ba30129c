"""The radix cache on the real default model: same tokens with the cache on and off, cached_tokens
reporting, and no leak after aborted bursts."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from radixrt.engine import Engine
from tests.conftest import Server

MODEL = "SmolLM2-135M-Instruct"
GREEDY = {"temperature": 0.0, "max_new_tokens": 8}


def _prompts(engine: Engine) -> list[list[int]]:
    rng = random.Random(5)
    system = engine.tokenizer.encode("You are a helpful assistant who answers briefly. " * 6)
    # Different suffix lengths so cached prefixes end at and inside page boundaries.
    return [system + [rng.randrange(100, 20000) for _ in range(k)] for k in (1, 5, 16, 17, 40)]


def _partial(prompts: list[list[int]]) -> list[int]:
    """A prefix that ends inside a page: prompts[4] stopped 3 tokens into its suffix."""
    return prompts[4][: len(prompts[4]) - 37]


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """The prompts, their greedy tokens in one batch and _partial's alone, with no radix cache."""
    eng = Engine(model_path=str(model_dir), disable_radix_cache=True, max_total_tokens=8192, device="cpu")
    prompts = _prompts(eng)
    outs = [o["output_ids"] for o in eng.generate(prompts, GREEDY)]
    solo = eng.generate([_partial(prompts)], GREEDY)[0]["output_ids"]
    return prompts, outs, solo


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_cache_on_gives_the_same_tokens_cold_and_warm(model_dir: Path, reference, page_size: int) -> None:
    prompts, want, solo = reference
    eng = Engine(model_path=str(model_dir), page_size=page_size, max_total_tokens=8192, device="cpu")
    cold = eng.generate(prompts, GREEDY)  # one batch: later prompts share the system prompt
    assert [o["output_ids"] for o in cold] == want
    warm = eng.generate(prompts, GREEDY)  # every prompt now hits the cache
    assert [o["output_ids"] for o in warm] == want
    for p, o in zip(prompts, warm, strict=True):
        # all but the last prompt token can come from the cache
        assert o["meta_info"]["cached_tokens"] >= ((len(p) - 1) // page_size) * page_size
    # a prefix that ends inside a page (_partial), against its tokens without the radix cache
    assert eng.generate([_partial(prompts)], GREEDY)[0]["output_ids"] == solo
    eng.scheduler.check_invariants()
    assert eng.scheduler.kv.stats()["num_protected_pages"] == 0


def test_long_shared_system_prompt_reports_cached_tokens(server: Server) -> None:
    c = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=300)
    system = " ".join(f"Rule {i}: always be precise about item {i}." for i in range(120))
    first = c.chat.completions.create(model=MODEL, temperature=0, max_tokens=4, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "Hi there"}])
    second = c.chat.completions.create(model=MODEL, temperature=0, max_tokens=4, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "What is rule 3?"}])
    info = httpx.get(f"{server.base_url}/get_server_info", timeout=30).json()
    page_size = info["page_size"]
    # the values in effect where flags were left to "auto": a CPU server, torch attention, 512-token chunks
    assert (info["device"], info["attention_backend"]) == ("cpu", "sdpa")
    assert info["chunked_prefill_size"] == info["scheduler"]["chunked_prefill_size"] > 0
    assert info["max_total_tokens"] == info["worker"]["pool_tokens"] > 0  # was null (break-it, 12-05)
    assert info["scheduler"]["cascade_attention"] is False  # torch backend: no cascade
    # The shared part: the system turn of the chat template (measured on the first request's prompt).
    shared = first.usage.prompt_tokens - 8  # the user turn "Hi there" + generation prompt, at most
    assert first.usage.prompt_tokens >= 1000
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= (shared // page_size) * page_size - page_size
    assert cached < second.usage.prompt_tokens


def test_aborted_burst_leaves_nothing_protected(server: Server) -> None:
    rng = random.Random(1)
    body = {"model": MODEL, "max_tokens": 32, "temperature": 0.7, "stream": True, "ignore_eos": True}

    def one(i: int) -> None:
        prompt = f"Tell me a long story about the number {i}. " * rng.randrange(1, 20)
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json={**body, "prompt": prompt},
                          timeout=120) as r:
            for n, _ in enumerate(r.iter_lines()):
                if i % 2 == 0 and n >= 2 + i % 5:  # half the clients hang up mid-stream
                    break

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    deadline = time.monotonic() + 30
    while True:
        sched = httpx.get(f"{server.base_url}/get_server_info", timeout=30).json()["scheduler"]
        if sched["num_running_reqs"] == 0 and sched["num_waiting_reqs"] == 0:
            break
        assert time.monotonic() < deadline, "server did not become idle"
        time.sleep(0.2)
    assert sched["num_protected_pages"] == 0
    assert sched["invariants_ok"] is True
    assert httpx.get(f"{server.base_url}/health", timeout=30).status_code == 200
