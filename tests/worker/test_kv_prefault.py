"""The CPU KV pool's idle prefault (kv_pool.PagedKVPool.prefault_step) and the worker loop that runs it
between passes (worker_proc._serve)."""

from __future__ import annotations

import torch

from radixrt import protocol
from radixrt.worker.kv_pool import OS_PAGE_BYTES, PagedKVPool
from radixrt.worker.worker_proc import PREFAULT_IDLE_MS, _serve


def test_prefault_walks_every_slot_once_and_keeps_the_contents() -> None:
    """Slices advance through the slots of every K and V buffer to the end, then report done; what the
    pool held (a cached prefix) is unchanged, and untouched slots stay zero."""
    pool = PagedKVPool(num_pages=40, page_size=16, num_layers=3, num_kv_heads=2, head_dim=32,
                       dtype=torch.float32, device="cpu")
    g = torch.Generator().manual_seed(0)
    for buf in pool.k_buffers + pool.v_buffers:
        buf[16:100] = torch.randn(84, 2, 32, generator=g)
    before = [b.clone() for b in pool.k_buffers + pool.v_buffers]
    row = 2 * 32 * 4
    slice_bytes = 6 * 4 * OS_PAGE_BYTES  # 4 pages per buffer per call
    steps, seen = 0, []
    while pool.prefault_step(slice_bytes):
        steps += 1
        seen.append(pool.prefault_next)
    assert pool.prefault_next == pool.num_slots and not pool.prefault_step(slice_bytes)
    assert seen == sorted(seen) and steps + 1 == -(-pool.num_slots // (slice_bytes // (row * 6)))
    for b, old in zip(pool.k_buffers + pool.v_buffers, before, strict=True):
        assert torch.equal(b, old)


class Runner:
    """A fake runner whose prefault needs `slices` idle calls; passes finish at once."""

    def __init__(self, log: list[str], slices: int) -> None:
        self.log, self.slices = log, slices

    def prefault_step(self) -> bool:
        self.slices -= 1
        self.log.append("prefault")
        return self.slices > 0

    def launch(self, batch: protocol.ForwardBatch) -> int:
        self.log.append(f"launch {batch.batch_id}")
        return batch.batch_id

    def poll(self, pending: int) -> bool:
        return True

    def finish(self, pending: int) -> protocol.ForwardResult:
        return protocol.ForwardResult(batch_id=pending)


class Inbox:
    """Scripted messages; None entries are polls that find nothing. A blocking receive (timeout None)
    skips the Nones, as a real socket waits for the next message."""

    def __init__(self, script: list) -> None:
        self.script = list(script)
        self.blocking = 0
        self.timeouts: list[int | None] = []  # of each receive

    def recv(self, timeout_ms: int | None = None):
        self.timeouts.append(timeout_ms)
        while self.script:
            msg = self.script.pop(0)
            if msg is not None or timeout_ms is not None:
                self.blocking += timeout_ms is None
                return msg
        raise AssertionError("receive with nothing left")


class Results:
    def send(self, res: protocol.ForwardResult) -> None:
        pass


def test_serve_prefaults_only_while_idle_then_blocks() -> None:
    """An empty poll runs one prefault slice; a queued pass is launched first; once the prefault is
    done the loop blocks on the socket again (no more polling)."""
    log: list[str] = []
    batch = protocol.ForwardBatch(batch_id=1, mode=int(protocol.ForwardMode.DECODE))
    inbox = Inbox([None, batch, None, None, None, protocol.ForwardBatch(batch_id=2, mode=1),
                   protocol.WorkerControl(kind="shutdown")])
    _serve(Runner(log, slices=3), inbox, Results())
    assert log == ["prefault", "launch 1", "prefault", "prefault", "launch 2"]
    assert inbox.blocking == 1  # batch 2: received with a blocking wait once the prefault ended
    # the first slice after a message waits PREFAULT_IDLE_MS; the next one follows with a plain poll
    idle = PREFAULT_IDLE_MS
    assert inbox.timeouts == [idle, 0, 0, idle, 0, None, 0]
