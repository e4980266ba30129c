"""Test doubles for the tokenizer process: a scripted fake scheduler and an in-thread HTTP front end."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import uvloop
import zmq

from radixrt import protocol
from radixrt.config import ServerArgs
from radixrt.ipc import IpcAddresses, Receiver, Sender
from radixrt.tokenizer_proc.main import bind_http, build_context, serve
from radixrt.tokenizer_proc.metrics import Metrics

# script(req) -> (output token ids, finish_reason at the end; None = never finish on its own)
Script = Callable[[protocol.GenerateReq], tuple[list[int], str | None]]


@dataclass
class _Live:
    req: protocol.GenerateReq
    ids: list[int]
    finish: str | None
    pos: int = 0


@dataclass
class FakeScheduler:
    """Binds addrs.scheduler_in like the real scheduler; answers each GenerateReq with `script`'s tokens,
    one token per TokenOutBatch every `interval_s`, and stops a request on AbortReq."""

    addrs: IpcAddresses
    script: Script
    interval_s: float = 0.0
    error: str | None = None  # when set, every request is rejected with this message
    received: list[protocol.GenerateReq] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    controls: list[str] = field(default_factory=list)
    batch_rids: bool = False  # send all live requests in one batch (exercises the per-rid split)
    burst: bool = False  # send each request's whole script at once, one TokenOutBatch per token
    worker_info: dict = field(default_factory=dict)  # the "worker" facts of get_server_info's answer

    def start(self) -> FakeScheduler:
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(5)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        ctx = zmq.Context()
        rx = Receiver(ctx, self.addrs.scheduler_in, protocol.TOKENIZER_TO_SCHEDULER)
        tx = Sender(ctx, self.addrs.tokenizer_in)
        self._ready.set()
        live: dict[str, _Live] = {}
        try:
            while not self._stop.is_set():
                msg = rx.recv(timeout_ms=int(self.interval_s * 1000) or 1)
                while msg is not None:
                    self._handle(msg, live, tx)
                    msg = rx.recv(timeout_ms=0)
                self._emit(live, tx)
        finally:
            rx.sock.close()
            tx.sock.close(linger=0)
            ctx.term()

    def _handle(self, msg: Any, live: dict[str, _Live], tx: Sender) -> None:
        if isinstance(msg, protocol.GenerateReq):
            self.received.append(msg)
            if self.error is not None:
                tx.send(_batch([(msg.rid, [], "abort", self.error, 0)], msg))
                return
            ids, finish = self.script(msg)
            live[msg.rid] = _Live(msg, list(ids), finish)
            if self.burst:
                lv = {msg.rid: live.pop(msg.rid)}
                while lv:
                    self._emit(lv, tx)
        elif isinstance(msg, protocol.AbortReq):
            self.aborted.append(msg.rid)
            live.pop(msg.rid, None)
        elif isinstance(msg, protocol.ControlReq):
            self.controls.append(msg.kind)
            data = {"scheduler": {"num_running_reqs": len(live), "num_waiting_reqs": 0},
                    **({"worker": self.worker_info} if self.worker_info else {})}
            tx.send(protocol.ControlResp(req_id=msg.req_id, ok=True, data=data))

    def _emit(self, live: dict[str, _Live], tx: Sender) -> None:
        items = []
        for rid, lv in list(live.items()):
            if lv.pos >= len(lv.ids):
                if lv.finish is not None:
                    items.append((rid, [], lv.finish, None, lv.pos))
                    del live[rid]
                continue
            tok = lv.ids[lv.pos]
            lv.pos += 1
            last = lv.pos == len(lv.ids) and lv.finish is not None
            items.append((rid, [tok], lv.finish if last else None, None, lv.pos))
            if last:
                del live[rid]
        if not items:
            return
        reqs = {it[0]: self.received_req(it[0]) for it in items}
        if self.batch_rids:
            tx.send(_batch(items, reqs))
        else:
            for it in items:
                tx.send(_batch([it], reqs))

    def received_req(self, rid: str) -> protocol.GenerateReq | None:
        for r in reversed(self.received):
            if r.rid == rid:
                return r
        return None


def _fake_logprobs(tok: int, k: int) -> tuple[float, list[int], list[float]]:
    """Deterministic fake logprobs: the sampled token first in the top list."""
    lp = -0.25
    ids = [tok] + [(tok + j) % 1000 + 1 for j in range(1, k)]
    vals = [lp - 0.5 * j for j in range(k)]
    return lp, ids, vals


def _batch(items: list[tuple[str, list[int], str | None, str | None, int]],
           reqs: Any) -> protocol.TokenOutBatch:
    out = protocol.TokenOutBatch()
    offsets, ids, lps, tids, tvals = [0], [], [], [], []
    for rid, toks, finish, err, count in items:
        req = reqs if isinstance(reqs, protocol.GenerateReq) else reqs.get(rid)
        ids.extend(toks)
        offsets.append(len(ids))
        if req is not None and req.return_logprob:
            for t in toks:
                lp, ti, tv = _fake_logprobs(t, req.top_logprobs_num)
                lps.append(lp)
                tids.extend(ti)
                tvals.extend(tv)
        out.rids.append(rid)
        out.top_logprobs_nums.append(req.top_logprobs_num if req is not None and req.return_logprob else -1)
        out.finish_reasons.append(finish)
        out.matched_stop.append(None)
        out.prompt_tokens.append(len(req.input_ids) if req is not None else 0)
        out.completion_tokens.append(count)
        out.cached_tokens.append(3)
        out.errors.append(err)
    out.offsets = np.array(offsets, np.int32)
    out.output_ids = np.array(ids, np.int32)
    out.logprobs = np.array(lps, np.float32)
    out.top_logprob_ids = np.array(tids, np.int32)
    out.top_logprobs = np.array(tvals, np.float32)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Front:
    """A real uvicorn front end in a background thread, wired to a FakeScheduler."""

    args: ServerArgs
    addrs: IpcAddresses
    sched: FakeScheduler
    thread: threading.Thread
    server: Any
    served_model: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.args.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sched.stop()
        self.addrs.cleanup()


def start_front(tokenizer: Any, model_dir: Path, script: Script, *, context_length: int = 2048,
                **arg_overrides: Any) -> Front:
    args = ServerArgs(port=free_port(), **arg_overrides)
    addrs = IpcAddresses.create()
    sched = FakeScheduler(addrs, script).start()
    metrics = Metrics()
    ctx = build_context(args, addrs, tokenizer, model_dir, {"context_length": context_length},
                        on_done=metrics.on_request_done)
    sock = bind_http(args.host, args.port)
    started: list[Any] = []
    ev = threading.Event()

    def on_started(server: Any) -> None:
        started.append(server)
        ev.set()

    def run() -> None:
        uvloop.run(serve(ctx, sock, on_started=on_started, metrics_routes=metrics.install))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not ev.wait(20):
        raise RuntimeError("front end did not start")
    return Front(args, addrs, sched, thread, started[0], ctx.served_model)


def wait_for(pred: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


