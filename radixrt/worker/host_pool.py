"""The worker's side of the host KV tier: a host copy of the paged pool, and the copies into it.

`HostKVPool` holds whole pages in host memory, pinned (page-locked) on CUDA and plain on CPU, laid
out page-major: one tensor `[num_pages, 2 * num_layers, page_bytes_per_buffer]` of bytes, so that a
host page (the K then V of every layer, in the order of PagedKVPool.page_views) is one contiguous
block and a run of consecutive host pages is one contiguous transfer. A host page is a byte copy of
a device page, whatever the KV dtype (FP8 included; the per-layer scales stay on the device pool).

`HostCopyEngine` runs the copies a ForwardBatch orders (protocol.ForwardBatch, "Host KV tier"; the
scheduler decides every page, as in memory/host_tier.py) and reports which finished:

    before the pass   loads (host -> device) and eviction stores (device -> host), in the
                      scheduler's order, on one copy stream that first waits for the work queued
                      so far; the pass then waits on the device for the stores (their pages may be
                      reused by it), not for the loads (no request of the pass reads them)
    after the pass    write-through stores, on the same stream behind the pass (it writes that KV)

Consecutive copies of one kind are moved together, in chunks of at most `chunk_pages` pages
through a device staging buffer `[chunk_pages, 2 * num_layers, words]`:

    load    one host -> staging transfer per run of consecutive host pages, then one index_copy_
            per K/V buffer scattering the staged pages into their (scattered) device pages
    store   one index_select per K/V buffer gathering the device pages into staging, then one
            staging -> host transfer per run of consecutive host pages

The copy stream is in order, so a load that follows a store of the same host page reads what the
store wrote, and the staging buffer is reused safely. The host never waits for a copy on the pass
path: `collect` polls CUDA events (and waits only for an IDLE pass, when the device has nothing
else to do). On CPU every copy is done when issued: the same code path, synchronous.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from radixrt import protocol
from radixrt.worker.kv_pool import PagedKVPool

LOAD, STORE_BEFORE, STORE_AFTER = 0, 1, 2  # ForwardBatch.copy_kinds (memory/host_tier.py)
STAGING_BYTES = 256 << 20  # device staging buffer of a HostCopyEngine (at least one page)


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


def _words(t: torch.Tensor) -> torch.Tensor:
    """t (uint8, last dim contiguous, storage aligned as torch allocates it) viewed with the widest
    integer dtype whose size divides the last dim (fewer, wider elements for the index kernels)."""
    for dtype in (torch.int64, torch.int32, torch.int16):
        size = torch.empty((), dtype=dtype).element_size()
        if t.shape[-1] % size == 0:
            return t.view(dtype)
    return t


class HostKVPool:
    """Pages `[num_pages, 2 * num_layers, page_bytes_per_buffer]` (uint8) in host memory.

    Args: as PagedKVPool (dtype: the device pool's KV dtype, which sets the bytes per page);
    pin: page-lock the memory (CUDA). Page 0 is reserved, as on the device.
    """

    def __init__(self, num_pages: int, page_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, pin: bool) -> None:
        if num_pages < 2:
            raise ValueError("the host KV pool needs at least 2 pages (page 0 is reserved)")
        self.num_pages, self.page_size, self.dtype = num_pages, page_size, dtype
        self.num_buffers = 2 * num_layers
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.page_bytes_per_buffer = page_size * num_kv_heads * head_dim * itemsize
        self.data = _host_buffer((num_pages, self.num_buffers, self.page_bytes_per_buffer), torch.uint8, pin)

    @property
    def page_bytes(self) -> int:
        """Bytes of one host page (all layers, K and V)."""
        return self.num_buffers * self.page_bytes_per_buffer

    def page(self, page: int, buffer: int) -> torch.Tensor:
        """Bytes [page_bytes_per_buffer] of one page in K/V buffer `buffer` (PagedKVPool.page_views order)."""
        return self.data[page, buffer]

    @staticmethod
    def num_pages_for(device_pool: PagedKVPool, size_gb: float, ratio: float) -> int:
        """Host pages (page 0 included) for --hicache-size GB, or --hicache-ratio x the device pool."""
        if size_gb > 0:
            page_bytes = device_pool.kv_bytes_per_token * device_pool.page_size
            return max(2, int(size_gb * 1e9) // page_bytes + 1)
        return max(2, int(ratio * (device_pool.num_pages - 1)) + 1)


@dataclass(slots=True)
class _Pending:
    """Copies moved together (consecutive, one kind) and reported done together."""

    copy_ids: list[int]
    kind: int
    nbytes: int
    cpu_s: float  # CPU: wall time of the copies (at issue: their start, perf_counter)
    start: torch.cuda.Event | None = None
    end: torch.cuda.Event | None = None
    pages: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (host, device) per copy


class HostCopyEngine:
    """Runs the host-tier copies of each ForwardBatch (see the module docstring). Worker-owned.

    Raises ValueError when the host pool's pages are not byte copies of the device pool's (another
    KV dtype or shape). num_copy_calls counts the transfers and index kernels issued (tests, bench).
    """

    def __init__(self, device_pool: PagedKVPool, host_pool: HostKVPool, staging_bytes: int = STAGING_BYTES
                 ) -> None:
        views = device_pool.page_views()
        if (host_pool.num_buffers, host_pool.page_bytes_per_buffer) != (len(views), views[0].shape[1]):
            raise ValueError(f"host pages of {host_pool.num_buffers} x {host_pool.page_bytes_per_buffer} B "
                             f"do not match device pages of {len(views)} x {views[0].shape[1]} B")
        self.dev, self.host = device_pool, host_pool
        self.cuda = device_pool.device.type == "cuda"
        self.stream = torch.cuda.Stream(device_pool.device) if self.cuda else None
        self.page_bytes = host_pool.page_bytes
        self.dev_pages = [_words(v) for v in views]  # per buffer [P, W]
        self.host_pages = _words(host_pool.data)  # [Ph, 2L, W]
        self.chunk_pages = max(1, min(staging_bytes // self.page_bytes, device_pool.num_pages))
        self.staging = torch.empty((self.chunk_pages, *self.host_pages.shape[1:]),
                                   dtype=self.host_pages.dtype, device=device_pool.device)
        self.pending: list[_Pending] = []
        self.num_copy_calls = 0

    def before_pass(self, batch: protocol.ForwardBatch) -> None:
        """Issue the batch's loads and eviction stores; the pass waits on the device for the stores."""
        kinds = batch.copy_kinds
        if not len(kinds):
            return
        groups = self._issue(batch, [i for i, k in enumerate(kinds.tolist()) if k != STORE_AFTER])
        stores = [p for p in groups if p.kind == STORE_BEFORE]
        if stores and stores[-1].end is not None:
            torch.cuda.current_stream(self.dev.device).wait_event(stores[-1].end)

    def after_pass(self, batch: protocol.ForwardBatch) -> None:
        """Issue the batch's write-through stores, behind the pass just queued."""
        if len(batch.copy_kinds):
            self._issue(batch, [i for i, k in enumerate(batch.copy_kinds.tolist()) if k == STORE_AFTER])

    def _issue(self, batch: protocol.ForwardBatch, which: list[int]) -> list[_Pending]:
        """Issue copies `which` (indices into the batch's copies, in order), consecutive ones of one
        kind as one group; returns the groups (also appended to self.pending)."""
        groups: list[_Pending] = []
        starts, kinds = batch.copy_starts.tolist(), batch.copy_kinds.tolist()
        for i in which:
            lo, hi = starts[i], starts[i + 1]
            if not groups or groups[-1].kind != kinds[i]:
                groups.append(_Pending([], kinds[i], 0, 0.0))
            g = groups[-1]
            g.copy_ids.append(int(batch.copy_ids[i]))
            g.nbytes += (hi - lo) * self.page_bytes
            g.pages.append((batch.copy_host_pages[lo:hi], batch.copy_device_pages[lo:hi]))
        if not groups:
            return groups
        if self.stream is None:
            for g in groups:
                self._run_group(g)
        else:
            self.stream.wait_stream(torch.cuda.current_stream(self.dev.device))
            with torch.cuda.stream(self.stream):
                for g in groups:
                    self._run_group(g)
        self.pending.extend(groups)
        return groups

    def _run_group(self, g: _Pending) -> None:
        """Issue one group's copies chunk by chunk through the staging buffer (current stream)."""
        host = np.concatenate([h for h, _ in g.pages]).astype(np.int64)
        dev = torch.from_numpy(np.concatenate([d for _, d in g.pages]).astype(np.int64))
        g.pages = []
        g.cpu_s = time.perf_counter()
        if self.stream is not None:
            g.start, g.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            g.start.record(self.stream)
            dev = dev.pin_memory().to(self.dev.device, non_blocking=True)
        for c0 in range(0, len(host), self.chunk_pages):
            c1 = min(c0 + self.chunk_pages, len(host))
            self._chunk(g.kind == LOAD, host[c0:c1], dev[c0:c1])
        if g.end is not None:
            g.end.record(self.stream)
        else:
            g.cpu_s = time.perf_counter() - g.cpu_s

    def _chunk(self, load: bool, host: np.ndarray, dev: torch.Tensor) -> None:
        """Move len(host) <= chunk_pages pages host[i] <-> device dev[i] through staging[:len(host)]."""
        stage = self.staging[: len(host)]
        runs = host_runs(host)
        if load:
            for h0, s0, n in runs:
                stage[s0:s0 + n].copy_(self.host_pages[h0:h0 + n], non_blocking=True)
            for j, buf in enumerate(self.dev_pages):
                buf.index_copy_(0, dev, stage[:, j])
        else:
            for j, buf in enumerate(self.dev_pages):
                torch.index_select(buf, 0, dev, out=stage[:, j])
            for h0, s0, n in runs:
                self.host_pages[h0:h0 + n].copy_(stage[s0:s0 + n], non_blocking=True)
        self.num_copy_calls += len(runs) + len(self.dev_pages)

    def collect(self, res: protocol.ForwardResult, wait: bool = False) -> None:
        """Report the copies finished so far in `res` (in issue order: the stream is in order);
        wait: block until all are (an IDLE pass). copy_load_s / copy_store_s: device time the copy
        stream spent on them (CUDA events around each group; wall time on CPU)."""
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
            done.extend(p.copy_ids)
            if p.kind == LOAD:
                res.copy_load_bytes += p.nbytes
                res.copy_load_s += seconds
            else:
                res.copy_store_bytes += p.nbytes
                res.copy_store_s += seconds
        res.copies_done = np.array(done, np.int32)


def host_runs(host: np.ndarray) -> list[tuple[int, int, int]]:
    """(host0, index0, n) runs covering host pages host[index0 : index0 + n] == host0, host0 + 1, ..."""
    if not len(host):
        return []
    h = np.asarray(host, np.int64)
    breaks = np.flatnonzero(np.diff(h) != 1) + 1
    bounds = [0, *breaks.tolist(), len(h)]
    return [(int(h[a]), a, b - a) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
