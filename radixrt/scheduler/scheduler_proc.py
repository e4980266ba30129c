"""The scheduler process: sockets around `Scheduler`, control requests, logging, debug checks.

Loop: drain the tokenizer channel (new requests, aborts, control) -> one `PassPipeline` step
(schedule a pass, send it to the worker, complete the previous one) -> stream new tokens back.
The pipeline (scheduler/pipeline.py) owns the pass loop; this module supplies how a pass travels:
`WorkerLink` sends it on ZeroMQ and waits on the result socket while serving the tokenizer channel.
When idle it blocks on the tokenizer channel (and, with RADIXRT_DEBUG_INVARIANTS=1, checks the KV
invariant once each time it goes idle after a message or a pass).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from radixrt.config import PROTOCOL_VERSION, Env, ServerArgs
from radixrt.gc_policy import freeze_startup_heap
from radixrt.ipc import FanoutSender, IpcAddresses, Receiver, Sender
from radixrt.protocol import (
    SCHEDULER_TO_WORKER,  # noqa: F401 - documents the channel
    TOKENIZER_TO_SCHEDULER,
    WORKER_TO_SCHEDULER,
    AbortReq,
    ControlReq,
    ControlResp,
    ForwardBatch,
    ForwardResult,
    GenerateReq,
    GrammarMask,
    Ready,
    WorkerControl,
)
from radixrt.scheduler.factory import build_scheduler
from radixrt.scheduler.pass_trace import maybe_trace
from radixrt.scheduler.pipeline import PassPipeline
from radixrt.scheduler.scheduler import UNCHUNKED

log = logging.getLogger("radixrt.scheduler")

IDLE_POLL_MS = 50
WAIT_POLL_MS = 200  # while waiting for a pass's result, look at the tokenizer channel this often
BUSY_HEALTHY_S = 120.0  # a pass running for less than this answers /health as alive
LOG_INTERVAL_S = 10.0


class WorkerLink:
    """PassLauncher over ZeroMQ: `launch` sends the ForwardBatch to the worker (the handle is its
    batch id); `finish` waits for the ForwardResult, calling `serve(wait_start_s)` meanwhile so the
    tokenizer channel is answered while a pass runs: as soon as a message arrives on `tok_sock` (when
    given), else every WAIT_POLL_MS. Taking arrivals in during the pass means that the requests of a
    burst that came in while it ran are already queued when its result does, and the next pass is
    scheduled at once (before 2026-12-03 they were read only after the result, or after WAIT_POLL_MS:
    on the H200 the device then idled ~21 ms after the first pass of the `shared-prefix` burst while
    127 requests were read and admitted, docs/benchmarks.md)."""

    def __init__(self, tx: Sender | FanoutSender, rx: Receiver, serve: Callable[[float], None],
                 tok_sock: zmq.Socket | None = None) -> None:
        self.tx, self.rx, self.serve = tx, rx, serve
        self.poller: zmq.Poller | None = None
        if tok_sock is not None:
            self.poller = zmq.Poller()
            self.poller.register(rx.sock, zmq.POLLIN)
            self.poller.register(tok_sock, zmq.POLLIN)

    def launch(self, batch: ForwardBatch) -> int:
        self.tx.send(batch)
        return batch.batch_id

    def supply_mask(self, handle: int, mask: GrammarMask) -> None:
        self.tx.send(mask)  # the worker waits for it before sampling pass `handle`

    def finish(self, handle: int) -> ForwardResult:
        t0 = time.perf_counter()
        if self.poller is None:
            while (res := self.rx.recv(timeout_ms=WAIT_POLL_MS)) is None:
                self.serve(t0)
            return res
        while (res := self.rx.recv(timeout_ms=0)) is None:  # the result first, whenever it is there
            self.poller.poll(WAIT_POLL_MS)  # a result or a tokenizer message, or WAIT_POLL_MS
            if (res := self.rx.recv(timeout_ms=0)) is not None:
                return res
            self.serve(t0)
        return res


class Wakeup:
    """A self-pipe: `set()`, from any thread, makes a zmq poll on `fd` return (compile threads wake
    the loop when a grammar is ready). `clear()` drains it. Both never block."""

    def __init__(self) -> None:
        self.fd, self._w = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._w, False)

    def set(self) -> None:
        try:
            os.write(self._w, b"x")
        except BlockingIOError:  # the pipe is full: a wake-up is pending anyway
            pass

    def clear(self) -> None:
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass


class SchedulerLoop:
    def __init__(self, args: ServerArgs, addrs: IpcAddresses, worker_info: dict[str, Any],
                 model_dir: Path | None = None) -> None:
        self.args = args
        self.worker_info = worker_info
        self.sched = build_scheduler(args, worker_info, model_dir)  # model_dir: grammar support
        self.debug_invariants = Env.read().debug_invariants
        ctx = zmq.Context.instance()
        self.rx_tok = Receiver(ctx, addrs.scheduler_in, TOKENIZER_TO_SCHEDULER)
        self.rx_worker = Receiver(ctx, addrs.scheduler_results, WORKER_TO_SCHEDULER)
        self.tx_tok = Sender(ctx, addrs.tokenizer_in)
        # --tp-size N: every pass, mask and control message goes to each rank (rank 0 answers)
        self.tx_worker = (Sender(ctx, addrs.worker_in) if args.tp_size == 1 else
                          FanoutSender(ctx, [addrs.worker_in_for(r) for r in range(args.tp_size)]))
        self.launcher = Sender(ctx, addrs.launcher_in)
        self.health_waiters: dict[str, str] = {}  # probe rid -> control req_id
        self.last_log_s = time.monotonic()
        link = WorkerLink(self.tx_worker, self.rx_worker, self._serve_while_waiting, self.rx_tok.sock)
        self.pipeline = PassPipeline(self.sched, link, overlap=not args.disable_overlap_schedule)
        self.pass_trace = maybe_trace(self.pipeline, Env.read().pass_trace)  # RADIXRT_PASS_TRACE
        self.steps_at_last_log = 0
        # stalled (work queued, none runnable: a grammar compiling): sleep until an arrival or a compile ends
        self.wakeup = Wakeup()
        self.sched.grammar.on_compiled = self.wakeup.set
        self.stall_poller = zmq.Poller()
        self.stall_poller.register(self.rx_tok.sock, zmq.POLLIN)
        self.stall_poller.register(self.wakeup.fd, zmq.POLLIN)

    def handle(self, msg: Any) -> None:
        if isinstance(msg, GenerateReq):
            self.sched.add_request(msg)
        elif isinstance(msg, AbortReq):
            self.sched.abort(msg.rid)
        elif isinstance(msg, ControlReq):
            self.handle_control(msg)

    def handle_control(self, msg: ControlReq) -> None:
        if msg.kind == "flush_cache":
            ok = self.sched.flush_cache()
            self.tx_tok.send(ControlResp(msg.req_id, ok, {} if ok else
                                         {"message": "cannot flush while requests are running"}))
        elif msg.kind == "get_server_info":
            self.tx_tok.send(ControlResp(msg.req_id, True, self.server_info()))
        elif msg.kind == "health" and not self.sched.is_idle:
            # busy: this loop answering between passes is the sign of life; a probe would queue
            # behind every waiting request and time out under load
            self.tx_tok.send(ControlResp(msg.req_id, True, {"busy": True}))
        elif msg.kind == "health":
            rid = f"health-{msg.req_id}"
            probe = GenerateReq(rid=rid, input_ids=np.array([self.worker_info["eos_token_ids"][0]], np.int32),
                                sampling={"temperature": 0.0, "max_new_tokens": 1})
            self.health_waiters[rid] = msg.req_id
            self.sched.add_request(probe, internal=True)
        else:
            self.tx_tok.send(ControlResp(msg.req_id, False, {"message": f"unknown control {msg.kind!r}"}))

    def server_info(self) -> dict[str, Any]:
        s = self.sched.stats()
        pl = self.pipeline
        steps = pl.num_passes
        s["forward_ms_mean"] = pl.forward_ms_total / max(steps, 1)
        s["result_wait_ms_mean"] = pl.wait_ms_total / max(steps, 1)
        s["schedule_ms_mean"] = pl.schedule_ms_total / max(steps, 1)
        s["num_steps"] = steps
        s["gpu_busy_ms_total"] = pl.gpu_busy_ms_total
        s["gpu_gap_ms_total"] = pl.gpu_gap_ms_total
        busy_and_gap = pl.gpu_busy_ms_total + pl.gpu_gap_ms_total
        s["gpu_idle_fraction"] = pl.gpu_gap_ms_total / busy_and_gap if busy_and_gap > 0 else None
        s["overlap_schedule"] = pl.overlap
        s["chunked_prefill_size"] = -1 if self.sched.chunk_size >= UNCHUNKED else self.sched.chunk_size
        s["cascade_attention"] = self.sched.cascade_min_saved_tokens > 0
        s["invariants_ok"] = None  # checked only when idle (running requests move pages)
        if self.sched.is_idle and self.pipeline.in_flight is None:
            try:
                self.sched.check_invariants()
                s["invariants_ok"] = True
            except AssertionError as e:
                s["invariants_ok"], s["invariant_error"] = False, str(e)
        args = self.args.to_dict()
        if args.get("api_key"):
            args["api_key"] = "***"
        return {"server_args": args, "worker": self.worker_info, "scheduler": s}

    def _serve_while_waiting(self, pass_wait_start: float) -> None:
        """While a pass runs (a long CPU prefill can take tens of seconds), keep answering: new
        requests and aborts are queued as usual; /get_server_info is answered; /health is answered
        at once while the pass has run under BUSY_HEALTHY_S - the worker is busy computing, which is
        as good a sign of life as the one-token probe that would otherwise wait behind it."""
        for msg in self.rx_tok.recv_all():
            if isinstance(msg, ControlReq) and msg.kind == "health":
                waited = time.perf_counter() - pass_wait_start
                if waited < BUSY_HEALTHY_S:
                    self.tx_tok.send(ControlResp(msg.req_id, True, {"busy": True}))
                else:  # the worker is stuck (hung device, stopped process): not healthy. Handing
                    # the probe to `handle` would answer "busy" forever while requests exist
                    self.tx_tok.send(ControlResp(msg.req_id, False, {
                        "message": f"the worker has not finished a pass in {waited:.0f} s"}))
                continue
            self.handle(msg)

    def flush_outputs(self) -> None:
        out, internal = self.sched.take_outputs()
        if out is not None:
            self.tx_tok.send(out)
        for req in internal:
            req_id = self.health_waiters.pop(req.rid, None)
            if req_id is not None:
                ok = req.finish_reason in ("stop", "length")
                self.tx_tok.send(ControlResp(req_id, ok, {"finish_reason": req.finish_reason}))

    def maybe_log(self) -> None:
        """A stats line every LOG_INTERVAL_S while there was work since the last one."""
        now = time.monotonic()
        steps = self.pipeline.num_passes
        if now - self.last_log_s < LOG_INTERVAL_S or steps == self.steps_at_last_log:
            return
        self.last_log_s, self.steps_at_last_log = now, steps
        s = self.sched.stats()
        log.info("running %d, waiting %d, pages free %s / evictable %s / protected %s, hit rate %.3f, "
                 "retractions %d", s["num_running_reqs"], s["num_waiting_reqs"], s.get("num_free_pages"),
                 s.get("num_evictable_pages"), s.get("num_protected_pages"), s.get("hit_rate", 0.0),
                 s["num_retractions"])

    def run(self) -> None:
        freeze_startup_heap()
        self.launcher.send(Ready("scheduler", PROTOCOL_VERSION, os.getpid(), {}))
        pipeline = self.pipeline
        busy = True
        # RADIXRT_DEBUG_INVARIANTS: the KV state changes only through a message or a pass, so an idle
        # loop checks it once after each change, not on every tick (a large tree took ~3% of a core)
        checked = False
        while True:
            if pipeline.long_pass_in_flight:  # late binding after a long pass
                pipeline.finish_in_flight()
                self.flush_outputs()
            timeout = 0 if not self.sched.is_idle or pipeline.in_flight is not None else IDLE_POLL_MS
            if not busy and timeout == 0 and pipeline.in_flight is None:
                # the last step found queued work but nothing it could run (a grammar compiling):
                # wait for an arrival or a finished compile instead of spinning
                self.stall_poller.poll(IDLE_POLL_MS)
                self.wakeup.clear()
            msg = self.rx_tok.recv(timeout_ms=timeout)
            if msg is not None:
                self.handle(msg)
                for m in self.rx_tok.recv_all():
                    self.handle(m)
            busy = pipeline.step()
            self.flush_outputs()
            checked = checked and msg is None and not busy
            if not busy and self.sched.is_idle and pipeline.in_flight is None:
                if self.debug_invariants and not checked:
                    self.sched.check_invariants()
                    checked = True
                if self.pass_trace is not None:
                    self.pass_trace.idle()
            self.maybe_log()


def run_scheduler(args: ServerArgs, addrs: IpcAddresses, worker_info: Callable[[], dict[str, Any]],
                  model_dir: Path | None = None) -> None:
    """Run the scheduler loop until killed; model_dir gives the tokenizer for constrained decoding.
    `worker_info()` returns the worker's Ready facts and may block until the worker is ready (the
    modules are imported meanwhile)."""
    loop = SchedulerLoop(args, addrs, worker_info(), model_dir)
    try:
        loop.run()
    finally:
        loop.tx_worker.send(WorkerControl("shutdown"))
