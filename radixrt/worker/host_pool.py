"""The worker's side of the host KV tier: a host copy of the paged pool, and the copies into it.

`HostKVPool` has the device pool's layout (per layer, K and V buffers of `num_pages * page_size`
slots, the same dtype: a host page is a byte copy of a device page, whatever the KV dtype), in
pinned (page-locked) memory on CUDA and plain memory on CPU. `HostCopyEngine` runs the copies a
ForwardBatch orders (protocol.ForwardBatch, "Host KV tier"; the scheduler decides every page, as in
memory/host_tier.py) and reports which finished:

    before the pass   loads (host -> device) and eviction stores (device -> host), in the
                      scheduler's order, on one copy stream that first waits for the work queued
                      so far; the pass then waits on the device for the stores (their pages may be
                      reused by it), not for the loads (no request of the pass reads them)
    after the pass    write-through stores, on the same stream behind the pass (it writes that KV)

The copy stream is in order, so a load that follows a store of the same host page reads what the
store wrote. The host never waits for a copy on the pass path: `collect` polls CUDA events (and
waits only for an IDLE pass, when the device has nothing else to do). On CPU every copy is done
when issued: the same code path, synchronous.

Each copy moves runs of pages consecutive on both sides as one slice copy per layer and K/V.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from radixrt import protocol
from radixrt.worker.kv_pool import PagedKVPool

LOAD, STORE_BEFORE, STORE_AFTER = 0, 1, 2  # ForwardBatch.copy_kinds (memory/host_tier.py)


def _host_buffer(shape: tuple[int, ...], dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """A host tensor, page-locked in place when pin (cudaHostRegister: exact size, unlike the
    caching pinned allocator, which rounds large blocks up to a power of two)."""
    t = torch.empty(shape, dtype=dtype)
    if pin:
        nbytes = t.numel() * t.element_size()
        err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed with error {int(err)}")
    return t


class HostKVPool:
    """K/V buffers `[num_pages * page_size, num_kv_heads, head_dim]` per layer in host memory.

    Args: as PagedKVPool; pin: page-lock the buffers (CUDA). Page 0 is reserved, as on the device.
    """

    def __init__(self, num_pages: int, page_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, pin: bool) -> None:
        if num_pages < 2:
            raise ValueError("the host KV pool needs at least 2 pages (page 0 is reserved)")
        self.num_pages, self.page_size, self.dtype = num_pages, page_size, dtype
        shape = (num_pages * page_size, num_kv_heads, head_dim)
        self.k_buffers = [_host_buffer(shape, dtype, pin) for _ in range(num_layers)]
        self.v_buffers = [_host_buffer(shape, dtype, pin) for _ in range(num_layers)]

    @staticmethod
    def num_pages_for(device_pool: PagedKVPool, size_gb: float, ratio: float) -> int:
        """Host pages (page 0 included) for --hicache-size GB, or --hicache-ratio x the device pool."""
        if size_gb > 0:
            page_bytes = device_pool.kv_bytes_per_token * device_pool.page_size
            return max(2, int(size_gb * 1e9) // page_bytes + 1)
        return max(2, int(ratio * (device_pool.num_pages - 1)) + 1)


@dataclass(slots=True)
class _Pending:
    copy_id: int
    kind: int
    nbytes: int
    cpu_s: float  # CPU: wall time of the copy (at issue: its start, perf_counter)
    start: torch.cuda.Event | None = None
    end: torch.cuda.Event | None = None


class HostCopyEngine:
    """Runs the host-tier copies of each ForwardBatch (see the module docstring). Worker-owned."""

    def __init__(self, device_pool: PagedKVPool, host_pool: HostKVPool) -> None:
        self.dev, self.host = device_pool, host_pool
        self.cuda = device_pool.device.type == "cuda"
        self.stream = torch.cuda.Stream(device_pool.device) if self.cuda else None
        self.page_bytes = device_pool.kv_bytes_per_token * device_pool.page_size
        self.pending: list[_Pending] = []

    def before_pass(self, batch: protocol.ForwardBatch) -> None:
        """Issue the batch's loads and eviction stores; the pass waits on the device for the stores."""
        kinds = batch.copy_kinds
        if not len(kinds):
            return
        self._issue(batch, [i for i, k in enumerate(kinds.tolist()) if k != STORE_AFTER])
        if self.cuda and bool((kinds == STORE_BEFORE).any()):
            torch.cuda.current_stream(self.dev.device).wait_stream(self.stream)

    def after_pass(self, batch: protocol.ForwardBatch) -> None:
        """Issue the batch's write-through stores, behind the pass just queued."""
        if len(batch.copy_kinds):
            self._issue(batch, [i for i, k in enumerate(batch.copy_kinds.tolist()) if k == STORE_AFTER])

    def _issue(self, batch: protocol.ForwardBatch, which: list[int]) -> None:
        if not which:
            return
        starts = batch.copy_starts.tolist()
        if self.stream is None:
            for i in which:
                self._copy_op(batch, i, starts)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.dev.device))
        with torch.cuda.stream(self.stream):
            for i in which:
                self._copy_op(batch, i, starts)

    def _copy_op(self, batch: protocol.ForwardBatch, i: int, starts: list[int]) -> None:
        kind = int(batch.copy_kinds[i])
        lo, hi = starts[i], starts[i + 1]
        host_pages, dev_pages = batch.copy_host_pages[lo:hi], batch.copy_device_pages[lo:hi]
        p = _Pending(int(batch.copy_ids[i]), kind, (hi - lo) * self.page_bytes, time.perf_counter())
        if self.stream is not None:
            p.start, p.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            p.start.record(self.stream)
        ps = self.dev.page_size
        pairs = zip(self.dev.k_buffers + self.dev.v_buffers, self.host.k_buffers + self.host.v_buffers,
                    strict=True)
        runs = page_runs(host_pages, dev_pages)
        for dev_buf, host_buf in pairs:
            for h0, d0, n in runs:
                h, d = host_buf[h0 * ps:(h0 + n) * ps], dev_buf[d0 * ps:(d0 + n) * ps]
                if kind == LOAD:
                    d.copy_(h, non_blocking=True)
                else:
                    h.copy_(d, non_blocking=True)
        if p.end is not None:
            p.end.record(self.stream)
        else:
            p.cpu_s = time.perf_counter() - p.cpu_s
        self.pending.append(p)

    def collect(self, res: protocol.ForwardResult, wait: bool = False) -> None:
        """Report the copies finished so far in `res` (in issue order: the stream is in order);
        wait: block until all are (an IDLE pass)."""
        done: list[int] = []
        while self.pending:
            p = self.pending[0]
            if p.end is not None:
                if wait:
                    p.end.synchronize()
                elif not p.end.query():
                    break
                seconds = p.start.elapsed_time(p.end) / 1e3  # type: ignore[union-attr]
            else:
                seconds = p.cpu_s
            self.pending.pop(0)
            done.append(p.copy_id)
            if p.kind == LOAD:
                res.copy_load_bytes += p.nbytes
                res.copy_load_s += seconds
            else:
                res.copy_store_bytes += p.nbytes
                res.copy_store_s += seconds
        res.copies_done = np.array(done, np.int32)


def page_runs(src: np.ndarray, dst: np.ndarray) -> list[tuple[int, int, int]]:
    """(src0, dst0, n) runs covering the page pairs src[i] -> dst[i], each run consecutive in both."""
    if not len(src):
        return []
    s, d = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    breaks = np.flatnonzero((np.diff(s) != 1) | (np.diff(d) != 1)) + 1
    bounds = [0, *breaks.tolist(), len(s)]
    return [(int(s[a]), int(d[a]), b - a) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
