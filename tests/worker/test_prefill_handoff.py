"""The CPU worker's pause after a pass with prompt rows (worker_proc._serve, PREFILL_HANDOFF_S): the
result carrying first tokens goes out, then the loop sleeps before it launches the next pass; decode
passes and CUDA workers go straight on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixrt import protocol
from radixrt.worker import worker_proc
from radixrt.worker.worker_proc import PREFILL_HANDOFF_S, _serve


class Runner:
    """A fake runner on `device` whose passes finish at once; it logs launches and sent results."""

    def __init__(self, log: list[str], device: str) -> None:
        self.log, self.device = log, torch.device(device)

    def launch(self, batch: protocol.ForwardBatch) -> int:
        self.log.append(f"launch {batch.batch_id}")
        return batch.batch_id

    def poll(self, pending: int) -> bool:
        return True

    def finish(self, pending: int) -> protocol.ForwardResult:
        self.log.append(f"result {pending}")
        return protocol.ForwardResult(batch_id=pending)


class Inbox:
    def __init__(self, script: list) -> None:
        self.script = list(script)

    def recv(self, timeout_ms: int | None = None):
        return self.script.pop(0)


class Results:
    def send(self, res: protocol.ForwardResult) -> None:
        pass


def _batch(batch_id: int, extend_lens: list[int]) -> protocol.ForwardBatch:
    mode = protocol.ForwardMode.EXTEND if max(extend_lens) > 1 else protocol.ForwardMode.DECODE
    return protocol.ForwardBatch(batch_id=batch_id, mode=int(mode),
                                 extend_lens=np.asarray(extend_lens, dtype=np.int32))


def _run(device: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    log: list[str] = []
    monkeypatch.setattr(worker_proc.time, "sleep", lambda s: log.append(f"sleep {s}"))
    # pass 1 has a prompt row, pass 2 only decodes, pass 3 mixes a prompt with a decode; each next
    # pass is already queued when the previous one is done (the overlap schedule)
    script = [_batch(1, [1800]), _batch(2, [1, 1]), _batch(3, [1, 32]), _batch(4, [1, 1]),
              protocol.WorkerControl(kind="shutdown")]
    _serve(Runner(log, device), Inbox(script), Results())
    return log


def test_cpu_worker_pauses_after_a_pass_with_prompt_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    pause = f"sleep {PREFILL_HANDOFF_S}"
    assert _run("cpu", monkeypatch) == ["launch 1", "result 1", pause, "launch 2", "result 2", "launch 3",
                                        "result 3", pause, "launch 4", "result 4"]


def test_cuda_worker_never_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not [e for e in _run("cuda", monkeypatch) if e.startswith("sleep")]
