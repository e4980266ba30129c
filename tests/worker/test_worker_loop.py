"""The worker's serve loop (worker_proc._serve): a pass that arrives while another is pending is
launched behind it before the pending result is sent; results go out in order, one per pass, and
shutdown flushes the pending one. Driven with a fake runner whose passes finish when told to."""

from __future__ import annotations

from radixrt import protocol
from radixrt.worker.worker_proc import _serve


class FakeRunner:
    def __init__(self, log: list[str], done_after_polls: int) -> None:
        self.log = log
        self.done_after_polls = done_after_polls
        self.polls = 0

    def launch(self, batch: protocol.ForwardBatch) -> int:
        self.log.append(f"launch {batch.batch_id}")
        self.polls = 0
        return batch.batch_id

    def poll(self, pending: int) -> bool:
        self.polls += 1
        return self.polls > self.done_after_polls

    def finish(self, pending: int) -> protocol.ForwardResult:
        self.log.append(f"finish {pending}")
        return protocol.ForwardResult(batch_id=pending)


class Inbox:
    """Yields scripted messages; `None` entries are polls that find nothing."""

    def __init__(self, script: list) -> None:
        self.script = list(script)

    def recv(self, timeout_ms: int | None = None):
        while self.script:
            msg = self.script.pop(0)
            if msg is not None or timeout_ms is not None:
                return msg
        raise AssertionError("blocking receive with nothing left")


class Results:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.sent: list[int] = []

    def send(self, res: protocol.ForwardResult) -> None:
        self.log.append(f"send {res.batch_id}")
        self.sent.append(res.batch_id)


def batch(i: int) -> protocol.ForwardBatch:
    return protocol.ForwardBatch(batch_id=i, mode=int(protocol.ForwardMode.DECODE))


def test_next_pass_is_launched_before_the_pending_result_is_sent() -> None:
    log: list[str] = []
    inbox = Inbox([batch(0), batch(1), None, None, batch(2), protocol.WorkerControl("shutdown")])
    results = Results(log)
    _serve(FakeRunner(log, done_after_polls=10), inbox, results)
    assert log == ["launch 0", "launch 1", "finish 0", "send 0", "launch 2", "finish 1", "send 1",
                   "finish 2", "send 2"]


def test_a_pass_alone_is_finished_when_the_device_is_done() -> None:
    log: list[str] = []
    inbox = Inbox([batch(0), None, None, None, batch(1), None, protocol.WorkerControl("shutdown")])
    _serve(FakeRunner(log, done_after_polls=2), inbox, Results(log))
    assert log == ["launch 0", "finish 0", "send 0", "launch 1", "finish 1", "send 1"]


def test_a_finished_pass_is_sent_before_the_next_launch() -> None:
    """On CPU a pass is done when launch returns: its tokens go out before the next pass runs."""
    log: list[str] = []
    inbox = Inbox([batch(0), batch(1), protocol.WorkerControl("shutdown")])
    _serve(FakeRunner(log, done_after_polls=0), inbox, Results(log))
    assert log == ["launch 0", "finish 0", "send 0", "launch 1", "finish 1", "send 1"]
