"""The scheduler process: sockets around `Scheduler`, control requests, logging, debug checks.

Loop: drain the tokenizer channel (new requests, aborts, control) -> schedule one pass -> send it
to the worker -> wait for its result -> process it -> stream new tokens back. When idle it blocks
on the tokenizer channel (and, with RADIXRT_DEBUG_INVARIANTS=1, checks the KV invariant each tick).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import numpy as np
import zmq

from radixrt.config import PROTOCOL_VERSION, Env, ServerArgs
from radixrt.gc_policy import freeze_startup_heap
from radixrt.ipc import IpcAddresses, Receiver, Sender
from radixrt.memory.kv_manager import KVManager
from radixrt.protocol import (
    SCHEDULER_TO_WORKER,  # noqa: F401 - documents the channel
    TOKENIZER_TO_SCHEDULER,
    WORKER_TO_SCHEDULER,
    AbortReq,
    ControlReq,
    ControlResp,
    GenerateReq,
    Ready,
    WorkerControl,
)
from radixrt.scheduler.batch import build_forward_batch
from radixrt.scheduler.cascade import DEFAULT_MIN_SAVED_TOKENS
from radixrt.scheduler.scheduler import UNCHUNKED, Scheduler

log = logging.getLogger("radixrt.scheduler")

IDLE_POLL_MS = 50
# A pass with at least this many prompt tokens runs long (tens to hundreds of ms on a GPU), so the
# next pass is built after it ends rather than during it: requests that arrive meanwhile join the
# very next pass (lower TTFT), and the few ms of scheduling that overlap would hide are small
# next to such a pass. Shorter passes (decode, small prefills) keep overlap scheduling, and so
# does a long pass that left requests waiting: the next pass has queued work to take (e.g. the
# requests deferred behind a shared prefix this pass publishes), so it is built at once.
LATE_BINDING_PREFILL_TOKENS = 1024
WAIT_POLL_MS = 200  # while waiting for a pass's result, look at the tokenizer channel this often
BUSY_HEALTHY_S = 120.0  # a pass running for less than this answers /health as alive
LOG_INTERVAL_S = 10.0


def build_scheduler(args: ServerArgs, worker_info: dict[str, Any]) -> Scheduler:
    """A Scheduler sized from the worker's Ready info (pool pages, rows, context, vocab, EOS)."""
    kv = KVManager.create(int(worker_info["num_pages"]), args.page_size, args.disable_radix_cache)
    return Scheduler(
        kv, page_size=args.page_size,
        max_running_requests=min(args.max_running_requests, int(worker_info["max_req_rows"])),
        chunk_size=args.resolved_chunked_prefill_size(), context_len=int(worker_info["context_length"]),
        vocab_size=int(worker_info["vocab_size"]), eos_token_ids=list(worker_info["eos_token_ids"]),
        schedule_policy=args.schedule_policy, max_queued_requests=args.max_queued_requests,
        random_seed=args.random_seed, max_prefill_tokens=args.max_prefill_tokens,
        cascade_min_saved_tokens=0 if (args.disable_cascade_attention
                                       or worker_info.get("attention_backend") != "triton")
        else DEFAULT_MIN_SAVED_TOKENS)


class SchedulerLoop:
    def __init__(self, args: ServerArgs, addrs: IpcAddresses, worker_info: dict[str, Any]) -> None:
        self.args = args
        self.worker_info = worker_info
        self.sched = build_scheduler(args, worker_info)
        self.debug_invariants = Env.read().debug_invariants
        ctx = zmq.Context.instance()
        self.rx_tok = Receiver(ctx, addrs.scheduler_in, TOKENIZER_TO_SCHEDULER)
        self.rx_worker = Receiver(ctx, addrs.scheduler_results, WORKER_TO_SCHEDULER)
        self.tx_tok = Sender(ctx, addrs.tokenizer_in)
        self.tx_worker = Sender(ctx, addrs.worker_in)
        self.launcher = Sender(ctx, addrs.launcher_in)
        self.health_waiters: dict[str, str] = {}  # probe rid -> control req_id
        self.last_log_s = time.monotonic()
        self.forward_ms_total = 0.0
        self.steps = 0
        self.overlap = not args.disable_overlap_schedule
        self.in_flight = None  # the pass sent but not yet processed (overlap scheduling)
        self.in_flight_long = False  # it carries >= LATE_BINDING_PREFILL_TOKENS prompt tokens
        self.wait_ms_total = 0.0  # time spent waiting for results: the scheduler idle, the worker busy
        self.schedule_ms_total = 0.0  # time building and sending passes
        # GPU time in passes, and GPU idle time between consecutive passes while there was work
        # (a pass built right after an idle period does not count its gap)
        self.gpu_busy_ms_total = 0.0
        self.gpu_gap_ms_total = 0.0
        self.prev_step_busy = False
        self.after_idle: set[int] = set()  # batch ids of passes built after an idle period
        self.steps_at_last_log = 0

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
        s["forward_ms_mean"] = self.forward_ms_total / max(self.steps, 1)
        s["result_wait_ms_mean"] = self.wait_ms_total / max(self.steps, 1)
        s["schedule_ms_mean"] = self.schedule_ms_total / max(self.steps, 1)
        s["num_steps"] = self.steps
        s["gpu_busy_ms_total"] = self.gpu_busy_ms_total
        s["gpu_gap_ms_total"] = self.gpu_gap_ms_total
        busy_and_gap = self.gpu_busy_ms_total + self.gpu_gap_ms_total
        s["gpu_idle_fraction"] = self.gpu_gap_ms_total / busy_and_gap if busy_and_gap > 0 else None
        s["overlap_schedule"] = self.overlap
        s["chunked_prefill_size"] = -1 if self.sched.chunk_size >= UNCHUNKED else self.sched.chunk_size
        s["cascade_attention"] = self.sched.cascade_min_saved_tokens > 0
        s["invariants_ok"] = None  # checked only when idle (running requests move pages)
        if self.sched.is_idle and self.in_flight is None:
            try:
                self.sched.check_invariants()
                s["invariants_ok"] = True
            except AssertionError as e:
                s["invariants_ok"], s["invariant_error"] = False, str(e)
        args = self.args.to_dict()
        if args.get("api_key"):
            args["api_key"] = "***"
        return {"server_args": args, "worker": self.worker_info, "scheduler": s}

    def step(self) -> bool:
        """Schedule and send one pass; process the previous one. False when there was nothing to do.

        Overlap scheduling: pass N+1 is built and sent before the result of pass N is read, so the
        worker starts N+1 as soon as N ends instead of waiting for the scheduler's Python; tokens
        sampled by N enter N+1 as in-flight inputs the worker fills in (see scheduler/req.py).
        With --disable-overlap-schedule each pass's result is processed before the next is built.
        """
        t0 = time.perf_counter()
        sb = self.sched.schedule()
        if sb is not None:
            self.tx_worker.send(build_forward_batch(sb))
            self.schedule_ms_total += (time.perf_counter() - t0) * 1e3
            if not self.prev_step_busy and self.in_flight is None:
                self.after_idle.add(sb.batch_id)
        busy = sb is not None or self.in_flight is not None
        self.prev_step_busy = busy
        if self.in_flight is not None:
            self._complete(self.in_flight)
        if sb is not None and not self.overlap:
            self._complete(sb)
            sb = None
        self.in_flight = sb
        self.in_flight_long = sb is not None and not self.sched.waiting and sum(
            it.extend_len for it in sb.items if it.extend_len > 1) >= LATE_BINDING_PREFILL_TOKENS
        return busy

    def _complete(self, sb) -> None:
        t0 = time.perf_counter()
        while (res := self.rx_worker.recv(timeout_ms=WAIT_POLL_MS)) is None:
            self._serve_while_waiting(t0)
        self.wait_ms_total += (time.perf_counter() - t0) * 1e3
        self.forward_ms_total += res.forward_ms
        self.gpu_busy_ms_total += res.gpu_busy_ms
        if sb.batch_id in self.after_idle:
            self.after_idle.discard(sb.batch_id)
        elif res.gpu_gap_ms >= 0:
            self.gpu_gap_ms_total += res.gpu_gap_ms
        self.steps += 1
        self.sched.process_result(sb, res)

    def _serve_while_waiting(self, pass_wait_start: float) -> None:
        """While a pass runs (a long CPU prefill can take tens of seconds), keep answering: new
        requests and aborts are queued as usual; /get_server_info is answered; /health is answered
        at once while the pass has run under BUSY_HEALTHY_S - the worker is busy computing, which is
        as good a sign of life as the one-token probe that would otherwise wait behind it."""
        for msg in self.rx_tok.recv_all():
            if isinstance(msg, ControlReq) and msg.kind == "health":
                if time.perf_counter() - pass_wait_start < BUSY_HEALTHY_S:
                    self.tx_tok.send(ControlResp(msg.req_id, True, {"busy": True}))
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
        if now - self.last_log_s < LOG_INTERVAL_S or self.steps == self.steps_at_last_log:
            return
        self.last_log_s, self.steps_at_last_log = now, self.steps
        s = self.sched.stats()
        log.info("running %d, waiting %d, pages free %s / evictable %s / protected %s, hit rate %.3f, "
                 "retractions %d", s["num_running_reqs"], s["num_waiting_reqs"], s.get("num_free_pages"),
                 s.get("num_evictable_pages"), s.get("num_protected_pages"), s.get("hit_rate", 0.0),
                 s["num_retractions"])

    def run(self) -> None:
        freeze_startup_heap()
        self.launcher.send(Ready("scheduler", PROTOCOL_VERSION, os.getpid(), {}))
        while True:
            if self.in_flight is not None and self.in_flight_long:  # late binding after a long pass
                self._complete(self.in_flight)
                self.in_flight = None
                self.flush_outputs()
            timeout = 0 if not self.sched.is_idle or self.in_flight is not None else IDLE_POLL_MS
            msg = self.rx_tok.recv(timeout_ms=timeout)
            if msg is not None:
                self.handle(msg)
                for m in self.rx_tok.recv_all():
                    self.handle(m)
            busy = self.step()
            self.flush_outputs()
            if not busy and self.sched.is_idle and self.in_flight is None and self.debug_invariants:
                self.sched.check_invariants()
            self.maybe_log()


def run_scheduler(args: ServerArgs, addrs: IpcAddresses, worker_info: dict[str, Any]) -> None:
    loop = SchedulerLoop(args, addrs, worker_info)
    try:
        loop.run()
    finally:
        loop.tx_worker.send(WorkerControl("shutdown"))
