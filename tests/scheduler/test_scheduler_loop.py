"""The scheduler process's loop over real ZeroMQ sockets, with the worker played by the test:
overlap scheduling sends pass N+1 before pass N's result for short passes, and late binding waits
for a long prefill pass to end before building the next (so arrivals join the very next pass)."""

from __future__ import annotations

import threading
import time

import numpy as np
import zmq

from radixrt import protocol
from radixrt.config import ServerArgs
from radixrt.ipc import IpcAddresses, Receiver, Sender
from radixrt.scheduler.pipeline import LATE_BINDING_PREFILL_TOKENS
from radixrt.scheduler.scheduler_proc import SchedulerLoop

INFO = {"num_pages": 1024, "page_size": 16, "max_req_rows": 8, "context_length": 4096, "vocab_size": 1000,
        "eos_token_ids": [999], "attention_backend": "torch"}


def _result(fb: protocol.ForwardBatch) -> protocol.ForwardResult:
    return protocol.ForwardResult(batch_id=fb.batch_id, next_token_ids=np.full(len(fb.req_rows), 5, np.int32))


def _running_loop(addrs: IpcAddresses) -> tuple[Receiver, Receiver, Sender, Sender]:
    """A SchedulerLoop on its own thread, with the test as worker and tokenizer process: the
    worker's input, the tokenizer's input, the channel into the scheduler and the result channel."""
    ctx = zmq.Context.instance()
    worker_in = Receiver(ctx, addrs.worker_in, protocol.SCHEDULER_TO_WORKER)
    tok_in = Receiver(ctx, addrs.tokenizer_in, protocol.SCHEDULER_TO_TOKENIZER)
    Receiver(ctx, addrs.launcher_in, protocol.CHILD_TO_LAUNCHER)
    loop = SchedulerLoop(ServerArgs(device="cpu", chunked_prefill_size=2048), addrs, INFO)
    threading.Thread(target=loop.run, daemon=True).start()
    return worker_in, tok_in, Sender(ctx, addrs.scheduler_in), Sender(ctx, addrs.scheduler_results)


def test_overlap_for_short_passes_and_late_binding_after_a_long_prefill() -> None:
    addrs = IpcAddresses.create()
    try:
        worker_in, tok_in, to_sched, results = _running_loop(addrs)
        long_prompt = np.arange(1, LATE_BINDING_PREFILL_TOKENS + 200, dtype=np.int32) % 900 + 1
        sampling = {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True}
        to_sched.send(protocol.GenerateReq(rid="long", input_ids=long_prompt, sampling=sampling))
        first = worker_in.recv(timeout_ms=5000)
        assert first is not None and int(first.extend_lens.sum()) == len(long_prompt)
        # a long pass: nothing more is sent until its result is back
        assert worker_in.recv(timeout_ms=300) is None
        # while it runs, /health and /get_server_info are still answered (a CPU prefill pass can
        # take longer than the tokenizer's 10 s control timeout)
        to_sched.send(protocol.ControlReq(req_id="h1", kind="health"))
        to_sched.send(protocol.ControlReq(req_id="i1", kind="get_server_info"))
        answers = {m.req_id: m for m in (tok_in.recv(timeout_ms=2000), tok_in.recv(timeout_ms=2000)) if m}
        assert answers["h1"].ok and answers["i1"].ok
        assert answers["i1"].data["scheduler"]["num_running_reqs"] == 1
        results.send(_result(first))
        second = worker_in.recv(timeout_ms=5000)
        assert second is not None and second.mode == int(protocol.ForwardMode.DECODE)
        # a short pass: the next one comes before its result (overlap scheduling)
        third = worker_in.recv(timeout_ms=5000)
        assert third is not None and third.batch_id == second.batch_id + 1
        # its input is the token `second` is still sampling: named, for the worker to fill in
        assert third.prev_token_pos.tolist() == [0] and third.prev_token_src.tolist() == [0]
        assert second.prev_token_pos.size == 0  # `first`'s result was back when it was built
        results.send(_result(second))
        results.send(_result(third))
    finally:
        addrs.cleanup()


def test_a_long_pass_that_leaves_requests_waiting_keeps_overlap() -> None:
    """Requests deferred behind a shared prefix wait while the first one's long pass runs; that pass
    publishes the prefix, so the next pass (the others, reusing it) is sent before its result."""
    addrs = IpcAddresses.create()
    ctx = zmq.Context.instance()
    try:
        worker_in = Receiver(ctx, addrs.worker_in, protocol.SCHEDULER_TO_WORKER)
        Receiver(ctx, addrs.tokenizer_in, protocol.SCHEDULER_TO_TOKENIZER)
        Receiver(ctx, addrs.launcher_in, protocol.CHILD_TO_LAUNCHER)
        loop = SchedulerLoop(ServerArgs(device="cpu", chunked_prefill_size=2048), addrs, INFO)
        to_sched = Sender(ctx, addrs.scheduler_in)
        results = Sender(ctx, addrs.scheduler_results)
        shared = (np.arange(LATE_BINDING_PREFILL_TOKENS + 96) % 900 + 1).astype(np.int32)
        for i in range(3):  # queued before the loop starts: all three are there at its first step
            to_sched.send(protocol.GenerateReq(
                rid=f"r{i}", input_ids=np.concatenate([shared, np.full(16, 10 + i, np.int32)]),
                sampling={"temperature": 0.0, "max_new_tokens": 2, "ignore_eos": True}))
        time.sleep(0.2)  # let ZeroMQ deliver them to the loop's socket
        threading.Thread(target=loop.run, daemon=True).start()
        first = worker_in.recv(timeout_ms=5000)
        assert first is not None and len(first.req_rows) == 1  # the others share its uncached prefix
        second = worker_in.recv(timeout_ms=5000)  # sent before the first pass's result
        assert second is not None and second.batch_id == first.batch_id + 1
        assert len(second.req_rows) == 3 and int(second.extend_lens.sum()) == 1 + 2 * 16
        results.send(_result(first))
        results.send(_result(second))
    finally:
        addrs.cleanup()


def test_arrivals_during_a_pass_are_taken_in_as_they_come(monkeypatch) -> None:
    """While a pass runs, the scheduler wakes for each tokenizer message, not on a timer: with the
    timer set to 30 s a control request is answered, and a prompt that came in is queued (seen by
    get_server_info), long before the pass's result arrives."""
    from radixrt.scheduler import scheduler_proc

    monkeypatch.setattr(scheduler_proc, "WAIT_POLL_MS", 30_000)
    addrs = IpcAddresses.create()
    try:
        worker_in, tok_in, to_sched, results = _running_loop(addrs)
        sampling = {"temperature": 0.0, "max_new_tokens": 2, "ignore_eos": True}
        prompt = np.arange(1, LATE_BINDING_PREFILL_TOKENS + 200, dtype=np.int32) % 900 + 1
        to_sched.send(protocol.GenerateReq(rid="long", input_ids=prompt, sampling=sampling))
        first = worker_in.recv(timeout_ms=5000)
        assert first is not None
        time.sleep(0.1)  # the loop is now waiting for `first`'s result
        to_sched.send(protocol.GenerateReq(rid="late", input_ids=np.arange(1, 40, dtype=np.int32),
                                           sampling=sampling))
        to_sched.send(protocol.ControlReq(req_id="i1", kind="get_server_info"))
        info = tok_in.recv(timeout_ms=5000)
        assert info is not None and info.req_id == "i1"
        assert info.data["scheduler"]["num_waiting_reqs"] == 1  # "late", queued during the pass
        assert worker_in.recv(timeout_ms=200) is None  # still inside the pass
        results.send(_result(first))
        second = worker_in.recv(timeout_ms=5000)
        assert second is not None and protocol.ForwardMode(second.mode) != protocol.ForwardMode.DECODE
        assert len(second.req_rows) == 2  # "late" joins the pass right after the long one
    finally:
        addrs.cleanup()


def test_health_fails_once_a_pass_has_run_past_the_busy_limit(monkeypatch) -> None:
    """A worker that never returns a pass (hung device, SIGSTOPped process) must fail /health once
    the pass has run BUSY_HEALTHY_S; before, the probe fell through to `handle`, which answers
    "busy" while requests run, so /health stayed 200 forever (repro/worker_stop.py)."""
    from radixrt.scheduler import scheduler_proc

    monkeypatch.setattr(scheduler_proc, "BUSY_HEALTHY_S", 0.5)
    addrs = IpcAddresses.create()
    try:
        worker_in, tok_in, to_sched, results = _running_loop(addrs)
        sampling = {"temperature": 0.0, "max_new_tokens": 2, "ignore_eos": True}
        to_sched.send(protocol.GenerateReq(rid="r", input_ids=np.arange(1, 40, dtype=np.int32),
                                           sampling=sampling))
        first = worker_in.recv(timeout_ms=5000)
        assert first is not None
        to_sched.send(protocol.ControlReq(req_id="h1", kind="health"))
        early = tok_in.recv(timeout_ms=2000)
        assert early is not None and early.req_id == "h1" and early.ok
        time.sleep(0.8)  # the worker "hangs": no result for longer than BUSY_HEALTHY_S
        to_sched.send(protocol.ControlReq(req_id="h2", kind="health"))
        late = tok_in.recv(timeout_ms=2000)
        assert late is not None and late.req_id == "h2" and not late.ok
        assert "has not finished a pass" in late.data["message"]
        results.send(_result(first))
    finally:
        addrs.cleanup()
