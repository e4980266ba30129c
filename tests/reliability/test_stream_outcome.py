"""Every streamed request is recorded exactly once, wherever the client's disconnect lands.

Drives the SSE response of a RequestHandle through the ASGI interface by hand (no server): the
scheduler side is a stand-in manager, the client a `send` that blocks on the response body (a full
socket: uvicorn waits for the transport to drain) and a `receive` that reports the disconnect.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request

from radixrt.tokenizer_proc.errors import install_handlers
from radixrt.tokenizer_proc.http_io import read_json
from radixrt.tokenizer_proc.manager import TokenChunk
from radixrt.tokenizer_proc.metrics import Metrics
from radixrt.tokenizer_proc.request_state import RequestHandle, SampleEvent, SampleSpec
from radixrt.tokenizer_proc.respond import respond


class _Manager:
    """Records what the handle tells the scheduler; delivers nothing by itself."""

    def __init__(self) -> None:
        self.inboxes: dict[str, Any] = {}
        self.aborted: list[str] = []

    def submit(self, req: Any, inbox: Any) -> None:
        self.inboxes[req.rid] = inbox

    def abort(self, rid: str, reason: str = "abort") -> None:
        self.inboxes.pop(rid, None)
        self.aborted.append(rid)

    def release(self, rid: str) -> None:
        self.inboxes.pop(rid, None)


class _Tokenizer:
    def decode(self, ids: list[int], **_: Any) -> str:
        return "".join(f"<{i}>" for i in ids)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [f"<{i}>" for i in ids]


class _Writer:
    def head(self) -> list[bytes]:
        return []

    def event(self, ev: SampleEvent, parts: list[bytes]) -> None:
        parts.append(b"data: " + ev.text.encode() + b"\n\n")

    def tail(self, last: dict[int, SampleEvent]) -> list[bytes]:
        return [b"data: [DONE]\n\n"]


def _chunk(rid: str, ids: list[int], finish: str | None) -> TokenChunk:
    return TokenChunk(rid=rid, ids=ids, logprobs=None, top_ids=None, top_logprobs=None, finish_reason=finish,
                      matched_stop=None, prompt_tokens=None, completion_tokens=None, cached_tokens=None,
                      error=None)


class _LeavingRequest:
    """A request whose client disconnects 10 ms after respond starts waiting."""

    async def receive(self) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {"type": "http.disconnect"}


class _StayingRequest:
    """A request whose client stays connected while respond waits for the first output."""

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def _stream_then_leave(finish_all: bool) -> tuple[list[str], _Manager]:
    """Stream one request; the client stops reading after the first body chunk, then disconnects.
    Returns the outcomes recorded by the time the response returned (the event loop still running:
    on a server it never stops, so nothing finalizes a body generator left suspended)."""
    manager, outcomes = _Manager(), []
    spec = SampleSpec(index=0, input_ids=[1, 2, 3], sampling={"max_new_tokens": 4}, stop=[])
    handle = RequestHandle(manager, _Tokenizer(), [spec], stream=True,  # type: ignore[arg-type]
                           on_done=lambda h, outcome: outcomes.append(outcome))
    rid = handle.id
    handle.queue.put_nowait(_chunk(rid, [7], None))
    response = await respond(_StayingRequest(), handle, _Writer())  # type: ignore[arg-type]
    if finish_all:  # the rest arrives: every token generated, only [DONE] still to be written
        handle.queue.put_nowait(_chunk(rid, [8, 9, 10], "length"))
    first_body, left = asyncio.Event(), asyncio.Event()
    never = asyncio.Event()

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.body" and msg.get("body"):
            if first_body.is_set():
                await never.wait()  # the socket is full: uvicorn waits for it to drain
            first_body.set()

    async def receive() -> dict[str, Any]:
        await first_body.wait()
        await asyncio.sleep(0.01)  # the generator reaches its next write
        left.set()
        return {"type": "http.disconnect"}

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}
    await asyncio.wait_for(response(scope, receive, send), 10)
    assert left.is_set()
    return list(outcomes), manager


def test_disconnect_while_a_write_is_blocked_records_the_outcome_once() -> None:
    outcomes, manager = asyncio.run(_stream_then_leave(finish_all=True))
    # every sample finished generating before the client left: the scheduler's work was done, "ok"
    assert outcomes == ["ok"]
    assert manager.aborted == [] and manager.inboxes == {}


def test_disconnect_mid_generation_is_aborted_once() -> None:
    outcomes, manager = asyncio.run(_stream_then_leave(finish_all=False))
    assert outcomes == ["aborted"]
    assert len(manager.aborted) == 1 and manager.inboxes == {}


def test_a_client_gone_before_its_request_was_read_is_recorded_as_disconnected(caplog: Any) -> None:
    """uvicorn answers receive() with http.disconnect once the connection is gone, even when the body
    was buffered: the request is never submitted, and its outcome is "disconnected", not a logged 500."""
    metrics = Metrics()
    app = FastAPI()
    install_handlers(app, on_unread=lambda: metrics.on_request_done(None, "disconnected"))
    reached: list[Any] = []

    @app.post("/v1/completions")
    async def _completions(request: Request) -> Any:
        reached.append(await read_json(request, 1 << 20))
        return {}

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    with caplog.at_level("INFO"):
        asyncio.run(app(scope, receive, send))
    assert reached == []
    assert sent[0]["status"] == 499, sent
    assert metrics.requests.labels(outcome="disconnected")._value.get() == 1.0
    assert not any("internal error" in r.getMessage() for r in caplog.records)


def test_handles_without_an_outcome_are_counted_live_and_when_collected() -> None:
    import gc

    from radixrt.tokenizer_proc import request_state as rs

    spec = SampleSpec(index=0, input_ids=[1, 2], sampling={}, stop=[])
    before = dict(rs.COLLECTED_UNFINISHED)
    done = RequestHandle(_Manager(), _Tokenizer(), [spec], stream=True)
    done.finish(None)
    dropped = RequestHandle(_Manager(), _Tokenizer(), [spec], stream=False)
    assert rs.unfinished_handles()["json"] >= 1
    del dropped, done
    gc.collect()
    assert rs.COLLECTED_UNFINISHED["json"] == before["json"] + 1  # the finished one is not counted
    assert rs.COLLECTED_UNFINISHED["stream_waiting"] == before["stream_waiting"]


def test_a_non_streamed_request_whose_client_leaves_is_aborted_once() -> None:
    """Not streamed: the disconnect cancels the collection (CancelOnDisconnect), respond raises
    ClientGone (the app answers 499), the unfinished sample is aborted and recorded once."""
    from radixrt.tokenizer_proc.errors import ClientGone

    manager, outcomes = _Manager(), []
    spec = SampleSpec(index=0, input_ids=[1, 2, 3], sampling={"max_new_tokens": 4}, stop=[])
    handle = RequestHandle(manager, _Tokenizer(), [spec], stream=False,  # type: ignore[arg-type]
                           on_done=lambda h, outcome: outcomes.append(outcome))

    async def run() -> BaseException | None:
        handle.queue.put_nowait(_chunk(handle.id, [7], None))  # some output, never the end
        try:
            await asyncio.wait_for(respond(_LeavingRequest(), handle, _Writer()), 10)  # type: ignore[arg-type]
        except BaseException as e:
            return e
        return None

    err = asyncio.run(run())
    assert isinstance(err, ClientGone)
    assert outcomes == ["aborted"] and manager.aborted == [handle.id] and manager.inboxes == {}


def test_a_stream_whose_client_leaves_before_the_first_token_is_aborted_at_once() -> None:
    """Streamed, the client leaves while the request still waits for its first output (queued or in
    prefill): the wait is cancelled (respond raises ClientGone, the app answers 499) and the sample
    aborted then, not after the whole prefill has run for nobody (docs/api.md, disconnects)."""
    from radixrt.tokenizer_proc.errors import ClientGone

    manager, outcomes = _Manager(), []
    spec = SampleSpec(index=0, input_ids=[1, 2, 3], sampling={"max_new_tokens": 4}, stop=[])
    handle = RequestHandle(manager, _Tokenizer(), [spec], stream=True,  # type: ignore[arg-type]
                           on_done=lambda h, outcome: outcomes.append(outcome))

    async def run() -> tuple[BaseException | None, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:  # no output ever arrives: before the fix this waited for the first token (here: 10 s)
            await asyncio.wait_for(respond(_LeavingRequest(), handle, _Writer()), 10)  # type: ignore[arg-type]
        except BaseException as e:
            return e, loop.time() - t0
        return None, loop.time() - t0

    err, waited = asyncio.run(run())
    assert isinstance(err, ClientGone) and waited < 5
    assert outcomes == ["aborted"] and manager.aborted == [handle.id] and manager.inboxes == {}
