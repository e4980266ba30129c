"""The scheduler process with grammars, over real ZeroMQ sockets and the worker played by the test:
a constrained decode pass goes out with its row deferred and its GrammarMask follows the previous
result; while only a compile is pending the loop sleeps (no busy poll) and wakes when it ends."""

from __future__ import annotations

import threading
import time

import numpy as np
import zmq

from radixrt import protocol
from radixrt.config import ServerArgs
from radixrt.ipc import IpcAddresses, Receiver, Sender
from radixrt.scheduler.scheduler_proc import SchedulerLoop, Wakeup
from tests.scheduler.test_grammar import ManualCompiler, compiler, constrained  # noqa: F401 - fixture
from tests.scheduler.test_scheduler import EOS, VOCAB

INFO = {"num_pages": 256, "page_size": 4, "max_req_rows": 8, "context_length": 512, "vocab_size": VOCAB,
        "eos_token_ids": [EOS], "attention_backend": "torch"}


def _sample(fb: protocol.ForwardBatch, mask: protocol.GrammarMask | None) -> protocol.ForwardResult:
    """Each constrained row samples its lowest allowed token (letters: a = id 10)."""
    from radixrt.worker.forward_pass import grammar_rows

    toks = np.full(len(fb.req_rows), 5, np.int32)
    rows, bitmask = grammar_rows(fb, mask)
    for r, i in enumerate(rows.tolist()):
        bits = np.unpackbits(bitmask[r].view(np.uint8), bitorder="little")
        toks[i] = int(np.flatnonzero(bits)[0])
    return protocol.ForwardResult(batch_id=fb.batch_id, next_token_ids=toks)


def test_wakeup_makes_a_poll_return_until_cleared() -> None:
    w = Wakeup()
    poller = zmq.Poller()
    poller.register(w.fd, zmq.POLLIN)
    assert poller.poll(0) == []
    w.set()
    w.set()
    assert poller.poll(0) != []
    w.clear()
    assert poller.poll(0) == []


def test_deferred_mask_follows_the_result_and_the_loop_sleeps_while_compiling(compiler) -> None:  # noqa: F811
    addrs = IpcAddresses.create()
    ctx = zmq.Context.instance()
    try:
        worker_in = Receiver(ctx, addrs.worker_in, protocol.SCHEDULER_TO_WORKER)
        Receiver(ctx, addrs.tokenizer_in, protocol.SCHEDULER_TO_TOKENIZER)
        Receiver(ctx, addrs.launcher_in, protocol.CHILD_TO_LAUNCHER)
        loop = SchedulerLoop(ServerArgs(device="cpu"), addrs, INFO)
        manual = ManualCompiler(compiler)
        loop.sched.grammar.compiler = manual
        steps = [0]
        step = loop.pipeline.step

        def counted_step() -> bool:
            steps[0] += 1
            return step()

        loop.pipeline.step = counted_step
        threading.Thread(target=loop.run, daemon=True).start()
        to_sched = Sender(ctx, addrs.scheduler_in)
        results = Sender(ctx, addrs.scheduler_results)
        to_sched.send(constrained("c", [1, 2, 3], "[a-z]{6}"))
        time.sleep(0.5)  # compile pending, nothing else queued: the loop must not spin meanwhile
        assert steps[0] < 40, f"{steps[0]} steps while only a compile was pending"
        assert worker_in.recv(timeout_ms=0) is None
        manual.finish_all()  # the compile thread's callback wakes the loop
        first = worker_in.recv(timeout_ms=5000)
        assert first is not None and len(first.grammar_rows) == 1 and len(first.grammar_deferred) == 0
        second = worker_in.recv(timeout_ms=5000)  # overlap: before the first result, row deferred
        assert second is not None and second.grammar_deferred.tolist() == [0]
        assert worker_in.recv(timeout_ms=300) is None  # its mask waits for the first result
        results.send(_sample(first, None))
        mask = worker_in.recv(timeout_ms=5000)
        assert isinstance(mask, protocol.GrammarMask) and mask.batch_id == second.batch_id
        assert mask.rows.tolist() == [0] and mask.bitmask.shape == (1, (VOCAB + 31) // 32)
        third = worker_in.recv(timeout_ms=5000)  # the next pass comes only after the mask
        assert third is not None and third.batch_id == second.batch_id + 1
        results.send(_sample(second, mask))
        mask3 = worker_in.recv(timeout_ms=5000)  # sent once `second`'s token was accepted
        assert isinstance(mask3, protocol.GrammarMask) and mask3.batch_id == third.batch_id
    finally:
        addrs.cleanup()
