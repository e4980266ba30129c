"""Hot-path pieces of streaming: Inbox, merged events per wake-up, the SSE chunk encoder, shutdown."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from radixrt.tokenizer_proc.manager import SHUTDOWN_ERROR, Inbox, TokenChunk
from radixrt.tokenizer_proc.request_state import RequestHandle, SampleEvent, SampleSpec
from radixrt.tokenizer_proc.respond import Collected, HandleStreamingResponse, open_stream
from radixrt.tokenizer_proc.sse import ChunkEncoder, sse

from .conftest import Scripts
from .fakes import Front


def _chunk(rid: str, ids: list[int], finish: str | None = None, error: str | None = None) -> TokenChunk:
    return TokenChunk(rid, ids, None, None, None, finish, None, 3, None, 0, error)


class _Manager:
    """Just what RequestHandle calls."""

    closing = False

    def __init__(self) -> None:
        self.released: list[str] = []
        self.aborted: list[str] = []

    def submit(self, req: Any, queue: Any) -> None:
        pass

    def abort(self, rid: str, reason: str = "abort") -> None:
        self.aborted.append(rid)

    def release(self, rid: str) -> None:
        self.released.append(rid)


def test_inbox_hands_over_everything_pending_at_once() -> None:
    async def run() -> list[list[int]]:
        box = Inbox()
        got: list[list[int]] = []

        async def reader() -> None:
            for _ in range(2):
                got.append([c.ids[0] for c in await box.take()])

        task = asyncio.ensure_future(reader())
        await asyncio.sleep(0)
        box.put_nowait(_chunk("a", [1]))
        box.put_nowait(_chunk("a", [2]))  # both before the reader runs: one wake-up
        await asyncio.sleep(0)
        box.put_nowait(_chunk("a", [3]))
        await asyncio.wait_for(task, 1)
        return got

    assert asyncio.run(run()) == [[1, 2], [3]]


def test_chunks_of_one_wake_up_become_one_event_per_sample(tokenizer: Any) -> None:
    hi = list(tokenizer.encode("Hello world", add_special_tokens=False))
    specs = [SampleSpec(index=i, input_ids=[1, 2, 3], sampling={}, stop=[]) for i in range(2)]

    async def run() -> tuple[list[list[tuple[int, str, list[int], Any]]], RequestHandle]:
        h = RequestHandle(_Manager(), tokenizer, specs, stream=True)  # type: ignore[arg-type]
        r0, r1 = list(h.samples)
        for t in hi:
            h.queue.put_nowait(_chunk(r0, [t]))
        h.queue.put_nowait(_chunk(r1, hi[:1]))
        out = []
        batches = h.event_batches()
        out.append([(e.index, e.text, e.token_ids, e.finish_reason) for e in await anext(batches)])
        h.queue.put_nowait(_chunk(r0, [], "length"))
        h.queue.put_nowait(_chunk(r1, hi[1:], "stop"))
        async for b in batches:
            out.append([(e.index, e.text, e.token_ids, e.finish_reason) for e in b])
        return out, h

    out, h = asyncio.run(run())
    first = tokenizer.decode(hi[:1])
    assert out == [[(0, "Hello world", hi, None), (1, first, hi[:1], None)],
                   [(0, "", [], "length"), (1, "Hello world"[len(first):], hi[1:], "stop")]]
    assert h.all_finished and sorted(h.manager.released) == sorted(h.samples)  # type: ignore[attr-defined]


def test_shutdown_error_reaches_the_reader(tokenizer: Any) -> None:
    from radixrt.tokenizer_proc.errors import APIError

    async def run() -> APIError:
        h = RequestHandle(_Manager(), tokenizer, [SampleSpec(0, [1], {}, [])], stream=True)  # type: ignore[arg-type]
        h.queue.put_nowait(_chunk(next(iter(h.samples)), [], "abort", SHUTDOWN_ERROR))
        with pytest.raises(APIError) as e:
            async for _ in h.event_batches():
                pass
        return e.value

    err = asyncio.run(run())
    assert err.status == 503 and err.message == "server is shutting down"


class _RecordingWriter:
    """A ResponseWriter whose chunks name what the response handed it."""

    def body(self, choices: dict[int, Collected]) -> Any:
        raise AssertionError("a stream has no body")

    def head(self) -> list[bytes]:
        return [b"head;"]

    def event(self, ev: SampleEvent, parts: list[bytes]) -> None:
        parts.append(f"{ev.index}:{ev.text}:{ev.finish_reason};".encode())

    def tail(self, last: dict[int, SampleEvent]) -> list[bytes]:
        return [f"tail{sorted(last)};".encode()]


async def _run_response(h: RequestHandle, writer: Any, feed: Any) -> list[dict[str, Any]]:
    """Open `h`'s stream and run its response over ASGI; `feed()` runs after the first body write.
    Returns the messages sent."""
    response = HandleStreamingResponse(h, await open_stream(h), writer)
    sent: list[dict[str, Any]] = []

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)
        if msg["type"] == "http.response.body" and len(sent) == 2:
            feed()

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError

    await asyncio.wait_for(response({"type": "http"}, receive, send), 5)
    return sent


def test_stream_writes_once_per_wake_up_and_the_last_write_carries_the_tail(tokenizer: Any) -> None:
    """The head goes out with the first events; the batch that finishes every sample goes out with
    the tail as the body's last message (more_body false: one write that also ends the body)."""
    hi = list(tokenizer.encode("Hello world", add_special_tokens=False))
    specs = [SampleSpec(index=i, input_ids=[1, 2, 3], sampling={}, stop=[]) for i in range(2)]
    manager = _Manager()

    async def run() -> tuple[list[dict[str, Any]], RequestHandle]:
        h = RequestHandle(manager, tokenizer, specs, stream=True)  # type: ignore[arg-type]
        r0, r1 = list(h.samples)
        h.queue.put_nowait(_chunk(r0, hi[:1]))

        def feed() -> None:
            h.queue.put_nowait(_chunk(r0, [], "length"))
            h.queue.put_nowait(_chunk(r1, hi, "stop"))

        return await _run_response(h, _RecordingWriter(), feed), h

    sent, h = asyncio.run(run())
    first = tokenizer.decode(hi[:1])
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in sent[0]["headers"]
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [
        (f"head;0:{first}:None;".encode(), True),
        (b"0::length;1:Hello world:stop;tail[0, 1];", False)]
    assert h.outcome == "ok" and set(manager.released) == set(h.samples) and not manager.aborted


def test_a_rejection_after_the_first_output_ends_the_stream_with_an_error_event(tokenizer: Any) -> None:
    """A sample rejected mid-stream: the OpenAI error event and [DONE] end the body; the request is
    recorded "error" (a 5xx) and its other sample aborted."""
    hi = list(tokenizer.encode("Hello", add_special_tokens=False))
    specs = [SampleSpec(index=i, input_ids=[1, 2, 3], sampling={}, stop=[]) for i in range(2)]
    manager = _Manager()

    async def run() -> tuple[list[dict[str, Any]], RequestHandle]:
        h = RequestHandle(manager, tokenizer, specs, stream=True)  # type: ignore[arg-type]
        r0, r1 = list(h.samples)
        h.queue.put_nowait(_chunk(r0, hi))
        return await _run_response(h, _RecordingWriter(),
                                   lambda: h.queue.put_nowait(_chunk(r0, [], "abort", SHUTDOWN_ERROR))), h

    sent, h = asyncio.run(run())
    assert sent[1] == {"type": "http.response.body", "body": b"head;0:Hello:None;", "more_body": True}
    last = sent[-1]
    assert last["more_body"] is False and last["body"].endswith(b"data: [DONE]\n\n")
    event = orjson.loads(last["body"].split(b"\n\n")[0].removeprefix(b"data: "))
    assert event == {"error": {"message": "server is shutting down", "type": "service_unavailable",
                               "param": None, "code": None}}
    assert h.outcome == "error" and manager.aborted == [list(h.samples)[1]]


def test_collected_joins_text_and_keeps_the_last_counts() -> None:
    c = Collected()
    c.add(SampleEvent(0, "Hel", [1], [], None, None, 4, 1, 2))
    c.add(SampleEvent(0, "lo", [2, 3], [], "stop", "\n", 4, 3, 2))
    assert (c.text, c.token_ids, c.finish_reason, c.matched_stop) == ("Hello", [1, 2, 3], "stop", "\n")
    assert (c.prompt_tokens, c.completion_tokens, c.cached_tokens) == (4, 3, 2)


@pytest.mark.parametrize(("meta", "extra"), [
    ({"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m"}, {}),
    ({"id": "c", "object": "chat.completion.chunk", "created": 5, "model": "m"}, {"usage": None}),
])
def test_chunk_encoder_matches_sse(meta: dict[str, Any], extra: dict[str, Any]) -> None:
    choice = {"index": 0, "text": 'é"\n😀', "logprobs": None, "finish_reason": None, "token_ids": [1, 2]}
    assert ChunkEncoder(meta, extra)(choice) == sse({**meta, "choices": [choice], **extra})


def test_a_stream_that_falls_behind_catches_up_in_fewer_events(fr: Front, front_scripts: Scripts) -> None:
    """Many TokenOutBatches queued at once for a request: far fewer SSE events than tokens, same output."""
    front_scripts.text = "one two three four five six seven eight nine ten " * 3
    ids = front_scripts.ids()
    fr.sched.burst = True
    body = {"model": fr.served_model, "prompt": "x", "max_tokens": 500, "stream": True,
            "return_token_ids": True}
    with httpx.stream("POST", fr.base_url + "/v1/completions", json=body, timeout=30) as r:
        events = [orjson.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    with_tokens = [e for e in events if e["choices"][0]["token_ids"]]
    toks = [t for e in events for t in e["choices"][0]["token_ids"]]
    assert toks == ids and "".join(e["choices"][0]["text"] for e in events) == front_scripts.text
    assert len(with_tokens) < len(ids) / 2, len(with_tokens)
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
