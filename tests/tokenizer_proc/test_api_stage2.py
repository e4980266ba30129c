"""n > 1, logprobs (chat and completions shapes), echo, parameter passthrough, /generate, /metrics."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .conftest import REPLY, Scripts
from .fakes import Front, wait_for
from .test_openai_api import MSGS, client, sse_events


def test_chat_n_samples_are_separate_requests(fr: Front, front_scripts: Scripts) -> None:
    r = client(fr).chat.completions.create(model=fr.served_model, messages=MSGS, n=3, seed=1)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content == REPLY for c in r.choices)
    reqs = fr.sched.received[-3:]
    assert len({q.rid for q in reqs}) == 3
    n_out = len(front_scripts.ids())
    assert r.usage.completion_tokens == 3 * n_out
    assert r.usage.prompt_tokens == len(reqs[0].input_ids)  # the prompt counts once


def test_stream_n_and_batched_outputs(fr: Front) -> None:
    fr.sched.batch_rids = True  # all samples' tokens in one TokenOutBatch
    body = {"model": fr.served_model, "messages": MSGS, "n": 2, "stream": True}
    events = sse_events(httpx.post(fr.base_url + "/v1/chat/completions", json=body))
    for i in (0, 1):
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == i]
        assert mine[0]["delta"]["role"] == "assistant"
        assert "".join(c["delta"].get("content", "") for c in mine) == REPLY
        assert mine[-1]["finish_reason"] == "stop" and all(c["finish_reason"] is None for c in mine[:-1])


def test_disconnect_aborts_every_sample(fr: Front, front_scripts: Scripts) -> None:
    front_scripts.finish = None
    front_scripts.ids_override = [28] * 10_000
    fr.sched.interval_s = 0.005
    body = {"model": fr.served_model, "messages": MSGS, "stream": True, "n": 3}
    with httpx.stream("POST", fr.base_url + "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        for _ in range(8):
            next(lines)
    # the fake scheduler may stream the first sample before it has read the other two requests
    assert wait_for(lambda: len({q.rid for q in fr.sched.received}) == 3, 10)
    rids = {q.rid for q in fr.sched.received}
    assert wait_for(lambda: rids <= set(fr.sched.aborted), 10)


def test_chat_logprobs(fr: Front, front_scripts: Scripts, tokenizer: Any) -> None:
    r = client(fr).chat.completions.create(model=fr.served_model, messages=MSGS, logprobs=True,
                                            top_logprobs=2)
    req = fr.sched.received[-1]
    assert req.return_logprob and req.top_logprobs_num == 2
    content = r.choices[0].logprobs.content
    ids = front_scripts.ids()
    assert len(content) == len(ids)
    assert all(c.logprob == pytest.approx(-0.25) and len(c.top_logprobs) == 2 for c in content)
    assert bytes(b for c in content for b in c.bytes).decode() == REPLY  # exact bytes, emoji split too
    assert content[0].top_logprobs[0].token == content[0].token
    assert any(c.token.startswith("bytes:") for c in content)  # a lone piece of the emoji


def test_chat_logprobs_stream(fr: Front, front_scripts: Scripts) -> None:
    body = {"model": fr.served_model, "messages": MSGS, "stream": True, "logprobs": True}
    events = sse_events(httpx.post(fr.base_url + "/v1/chat/completions", json=body))
    lps = [x for e in events if e["choices"][0]["logprobs"] for x in e["choices"][0]["logprobs"]["content"]]
    assert len(lps) == len(front_scripts.ids()) and all(x["top_logprobs"] == [] for x in lps)


def test_completions_logprobs_and_echo(fr: Front, front_scripts: Scripts, tokenizer: Any) -> None:
    r = client(fr).completions.create(model=fr.served_model, prompt="Tell me", logprobs=3, echo=True,
                                       max_tokens=64)
    prompt_ids = tokenizer.encode("Tell me", add_special_tokens=False)
    ch = r.choices[0]
    assert ch.text == "Tell me" + REPLY
    lp = ch.logprobs
    n_all = len(prompt_ids) + len(front_scripts.ids())
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n_all
    assert lp.token_logprobs[:len(prompt_ids)] == [None] * len(prompt_ids)
    assert lp.token_logprobs[-1] == pytest.approx(-0.25) and len(lp.top_logprobs[-1]) <= 3
    assert lp.text_offset == sorted(lp.text_offset)
    assert fr.sched.received[-1].top_logprobs_num == 3


def test_completions_echo_stream(fr: Front) -> None:
    body = {"model": fr.served_model, "prompt": "Tell me", "echo": True, "stream": True, "max_tokens": 64}
    events = sse_events(httpx.post(fr.base_url + "/v1/completions", json=body))
    assert events[0]["choices"][0]["text"] == "Tell me"
    assert "".join(e["choices"][0]["text"] for e in events) == "Tell me" + REPLY


def test_sampling_passthrough(fr: Front) -> None:
    body = {"model": fr.served_model, "messages": MSGS, "top_k": 5, "min_p": 0.1, "frequency_penalty": 0.5,
            "presence_penalty": -0.5, "repetition_penalty": 1.1, "ignore_eos": True,
            "stop_token_ids": [2, 7], "logit_bias": {"28": -100}, "top_p": 0.9, "temperature": 0.7}
    assert httpx.post(fr.base_url + "/v1/chat/completions", json=body).status_code == 200
    s = fr.sched.received[-1].sampling
    assert (s["top_k"], s["min_p"], s["frequency_penalty"], s["presence_penalty"]) == (5, 0.1, 0.5, -0.5)
    assert s["repetition_penalty"] == 1.1 and s["ignore_eos"] is True and s["stop_token_ids"] == [2, 7]
    assert s["logit_bias"] == {"28": -100} and s["top_p"] == 0.9 and s["temperature"] == 0.7


def test_generate_native(fr: Front, front_scripts: Scripts, tokenizer: Any) -> None:
    r = httpx.post(fr.base_url + "/generate", json={"text": "Hi", "sampling_params": {
        "max_new_tokens": 64, "temperature": 0, "stop": "zz"}})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["text"] == REPLY and out["output_ids"] == front_scripts.ids()
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(tokenizer.encode("Hi", add_special_tokens=False))
    assert meta["completion_tokens"] == len(front_scripts.ids()) and meta["finish_reason"] == "stop"
    assert meta["cached_tokens"] == 3
    s = fr.sched.received[-1].sampling
    assert s["max_new_tokens"] == 64 and s["temperature"] == 0 and s["stop"] == ["zz"]
    batch = httpx.post(fr.base_url + "/generate", json={"input_ids": [[5, 6], [7]], "return_logprob": True})
    assert [b["text"] for b in batch.json()] == [REPLY, REPLY]
    assert len(batch.json()[0]["meta_info"]["output_token_logprobs"]) == len(front_scripts.ids())


def test_generate_stream_and_errors(fr: Front) -> None:
    events = sse_events(httpx.post(fr.base_url + "/generate", json={"text": "Hi", "stream": True}))
    assert events[-1]["text"] == REPLY and events[-1]["meta_info"]["finish_reason"] == "stop"
    for body, param in [({"text": "x", "input_ids": [1]}, "text"), ({}, "text"),
                        ({"text": "x", "sampling_params": {"temperature": -1}},
                         "sampling_params.temperature"),
                        ({"text": "x", "sampling_params": {"max_new_tokens": "5"}},
                         "sampling_params.max_new_tokens"),
                        # was named sampling_params.max_tokens, chat's name (break-it pass 3)
                        ({"text": "x", "sampling_params": {"max_new_tokens": -1}},
                         "sampling_params.max_new_tokens"),
                        ({"text": "x", "sampling_params": {"bogus": 1}}, "sampling_params.bogus")]:
        r = httpx.post(fr.base_url + "/generate", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)


# (chat field, value, chat param): /generate's sampling_params take the same value and must give the same
# answer, a 400 naming sampling_params.<field> (break-it pass 3: /generate took all of these with a 200)
SAME_AS_CHAT = [
    ("stop_token_ids", [-1], "stop_token_ids[0]"), ("stop_token_ids", [1 << 63], "stop_token_ids"),
    ("stop_token_ids", [10 ** 6], "stop_token_ids"), ("stop", "", "stop"), ("stop", ["a", ""], "stop"),
    ("stop", [str(i) for i in range(17)], "stop"), ("logit_bias", {"\u0665": 1}, "logit_bias"),
    ("logit_bias", {"abc": 1}, "logit_bias"), ("logit_bias", {"\u00b2": 1}, "logit_bias"),
    ("logit_bias", {"1000000": 1}, "logit_bias"),
]


@pytest.mark.parametrize("field, value, chat_param", SAME_AS_CHAT)
def test_generate_refuses_what_chat_refuses(fr: Front, field: str, value: Any, chat_param: str) -> None:
    chat = {"model": fr.served_model, "messages": MSGS, "max_tokens": 2, field: value}
    r = httpx.post(fr.base_url + "/v1/chat/completions", json=chat)
    assert r.status_code == 400 and r.json()["error"]["param"] == chat_param, r.text
    gen = {"text": "x", "sampling_params": {"max_new_tokens": 2, field: value}}
    r = httpx.post(fr.base_url + "/generate", json=gen)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == f"sampling_params.{field}" and err["message"].startswith(err["param"]), err
    assert not fr.sched.received


def test_generate_refuses_image_data(fr: Front) -> None:
    """image_data is a 400 naming it, as chat refuses image parts (break-it pass 3: silently ignored);
    null is no image."""
    body = {"text": "x", "image_data": "data:image/png;base64,AAAA", "sampling_params": {"max_new_tokens": 2}}
    r = httpx.post(fr.base_url + "/generate", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "image_data", r.text
    assert "not supported" in r.json()["error"]["message"] and not fr.sched.received
    body["image_data"] = None
    assert httpx.post(fr.base_url + "/generate", json=body).status_code == 200


def test_metrics(fr: Front) -> None:
    client(fr).chat.completions.create(model=fr.served_model, messages=MSGS)
    httpx.post(fr.base_url + "/v1/chat/completions", json={"model": "nope", "messages": MSGS})
    text = httpx.get(fr.base_url + "/metrics").text
    assert 'radixrt_requests_total{outcome="ok"}' in text
    assert "radixrt_time_to_first_token_seconds_count" in text
    assert "radixrt_inter_token_latency_seconds_bucket" in text
    assert "radixrt_e2e_request_latency_seconds_sum" in text
    assert "radixrt_num_running_reqs 0.0" in text and "radixrt_scheduler_up 1.0" in text
    gen = [ln for ln in text.splitlines() if ln.startswith("radixrt_generation_tokens_total")]
    assert gen and float(gen[0].split()[-1]) > 0


@pytest.mark.parametrize("seed, ok", [(-(1 << 63), True), ((1 << 63) - 1, True), (1 << 63, False),
                                      ((1 << 64) - 1, False), (-(1 << 63) - 1, False)])
def test_seed_range_is_int64(fr: Front, seed: int, ok: bool) -> None:
    """Seeds outside int64 are a 400 naming `seed` (2^63 used to sample as seed 0; the break-it report of
    2026-12-04, F6); the ends of the range pass through."""
    body = {"model": fr.served_model, "messages": MSGS, "seed": seed, "max_tokens": 2}
    r = httpx.post(fr.base_url + "/v1/chat/completions", json=body)
    if ok:
        assert r.status_code == 200, r.text
        assert fr.sched.received[-1].sampling["seed"] == seed
    else:
        assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text


def test_completion_text_offsets_index_into_the_text(tokenizer: Any) -> None:
    """text_offset[i] is where token i starts in the choice's text: a skipped special token takes no
    room, the byte tokens of one character share its start, and every offset is <= len(text) (they
    used to advance by the display string: "<|im_start|>" 12, "bytes:\\xef\\xbc" 14; the break-it
    report of 2026-12-04, F4). Without skipping, the special token's text counts."""
    from radixrt.tokenizer_proc.logprobs import CompletionLogprobs, TokenTexts
    from radixrt.tokenizer_proc.request_state import TokenLogprob

    texts = TokenTexts(tokenizer)
    special = tokenizer.convert_tokens_to_ids("<|im_start|>")
    added = tokenizer.convert_tokens_to_ids("<file_sep>")  # an added token marked special, not in
    assert added not in tokenizer.all_special_ids and added in texts.special_ids  # all_special_ids
    ids = (tokenizer.encode("\n", add_special_tokens=False) + [special, added]
           + tokenizer.encode("assistant ＃＃ é", add_special_tokens=False))
    for skip in (True, False):
        text = tokenizer.decode(ids, skip_special_tokens=skip)
        acc = CompletionLogprobs(texts, skip_special=skip)
        acc.add([TokenLogprob(token_id=t, logprob=-1.0, top=[]) for t in ids])
        offsets = acc.take()["text_offset"]
        assert offsets == sorted(offsets) and offsets[-1] <= len(text), (skip, offsets, len(text))
        for t, off in zip(ids, offsets, strict=True):
            tok = texts.get(t)[0]
            if not tok.startswith("bytes:") and not (skip and t in (special, added)):
                assert text[off:off + len(tok)] == tok, (skip, t, tok, off, text)
    assert texts.get(special)[0] == "<|im_start|>" and special in texts.special_ids


def test_echo_returns_a_text_prompt_as_sent(fr: Front) -> None:
    """echo with a text prompt holding special tokens: the prompt exactly as sent (F5 of the break-it
    report: the special tokens were dropped), and the text offsets of the echoed tokens count them."""
    prompt = "<|im_start|>user\nHi<|im_end|>"
    body = {"model": fr.served_model, "prompt": prompt, "echo": True, "max_tokens": 4, "logprobs": 1}
    r = httpx.post(fr.base_url + "/v1/completions", json=body)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["text"].startswith(prompt)
    offsets = ch["logprobs"]["text_offset"]
    assert offsets == sorted(offsets) and offsets[-1] <= len(ch["text"])
    assert offsets[1] == len("<|im_start|>")  # the echoed special token takes its room
