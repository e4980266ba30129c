"""HostCopyEngine: stores and loads of scattered page sets round-trip byte for byte, in few copies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixrt.protocol import ForwardBatch, ForwardMode, ForwardResult
from radixrt.worker.host_pool import LOAD, STORE_AFTER, STORE_BEFORE, HostCopyEngine, HostKVPool, host_runs
from radixrt.worker.kv_pool import PagedKVPool

I32 = np.int32
LAYERS, HKV, D = 3, 2, 8


def _batch(ops: list[tuple[int, int, list[int], list[int]]]) -> ForwardBatch:
    """A copies-only batch of (copy_id, kind, host_pages, device_pages) ops."""
    fb = ForwardBatch(batch_id=0, mode=int(ForwardMode.IDLE))
    fb.copy_ids = np.array([o[0] for o in ops], I32)
    fb.copy_kinds = np.array([o[1] for o in ops], I32)
    fb.copy_starts = np.cumsum([0] + [len(o[2]) for o in ops]).astype(I32)
    fb.copy_host_pages = np.array([p for o in ops for p in o[2]], I32)
    fb.copy_device_pages = np.array([p for o in ops for p in o[3]], I32)
    return fb


def _pools(dtype: torch.dtype, page_size: int, staging_pages: int) -> tuple[PagedKVPool, HostCopyEngine]:
    dev = PagedKVPool(40, page_size, LAYERS, HKV, D, dtype, "cpu")
    gen = torch.Generator().manual_seed(page_size)
    for view in dev.page_views():  # random bytes (FP8 included: every pattern is a byte pattern)
        view.copy_(torch.randint(0, 256, view.shape, dtype=torch.uint8, generator=gen))
    host = HostKVPool(30, page_size, LAYERS, HKV, D, dtype, pin=False)
    return dev, HostCopyEngine(dev, host, staging_bytes=staging_pages * host.page_bytes)


def _bytes(dev: PagedKVPool, pages: list[int]) -> list[torch.Tensor]:
    return [v[pages].clone() for v in dev.page_views()]


def _run(engine: HostCopyEngine, fb: ForwardBatch) -> ForwardResult:
    engine.before_pass(fb)
    engine.after_pass(fb)
    res = ForwardResult(batch_id=fb.batch_id)
    engine.collect(res, wait=True)
    return res


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_scattered_store_then_load_round_trips_exactly(dtype: torch.dtype, page_size: int) -> None:
    dev, engine = _pools(dtype, page_size, staging_pages=3)  # 3 pages a chunk: several chunks
    src = [7, 2, 31, 30, 11, 5, 19]  # scattered device pages
    host_a, host_b = [3, 4, 5, 6], [20, 9, 10]  # one run of 4, then 20 alone and a run of 2
    want = _bytes(dev, src)
    res = _run(engine, _batch([(1, STORE_AFTER, host_a, src[:4]), (2, STORE_BEFORE, host_b, src[4:])]))
    assert res.copies_done.tolist() == [2, 1]  # before-pass stores first, then write-through
    assert res.copy_store_bytes == 7 * engine.page_bytes and res.copy_load_bytes == 0
    for i, p in enumerate(host_a + host_b):  # the host pages hold the device pages' bytes
        assert all(torch.equal(engine.host.page(p, j), want[j][i]) for j in range(2 * LAYERS))
    dst = [33, 1, 14, 8, 26, 38, 21]
    untouched = _bytes(dev, [p for p in range(1, 40) if p not in dst])
    res = _run(engine, _batch([(3, LOAD, host_a + host_b[:1], dst[:5]), (4, LOAD, host_b[1:], dst[5:])]))
    assert res.copies_done.tolist() == [3, 4] and res.copy_load_bytes == 7 * engine.page_bytes
    got = _bytes(dev, dst)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    after = _bytes(dev, [p for p in range(1, 40) if p not in dst])
    assert all(torch.equal(a, b) for a, b in zip(after, untouched, strict=True))


def test_one_load_takes_a_transfer_per_host_run_and_a_scatter_per_buffer() -> None:
    dev, engine = _pools(torch.float32, 16, staging_pages=64)
    dst = list(range(39, 9, -3))  # 10 scattered device pages (no two consecutive)
    _run(engine, _batch([(1, LOAD, list(range(5, 15)), dst)]))  # one host run
    assert engine.num_copy_calls == 1 + 2 * LAYERS  # the old per-run copies: 10 * 2 * LAYERS
    engine.num_copy_calls = 0
    _run(engine, _batch([(2, LOAD, [1, 2, 3, 20, 21], dst[:5]), (3, LOAD, [22, 8], dst[5:7])]))
    assert engine.num_copy_calls == 3 + 2 * LAYERS  # runs 1-3, 20-22, 8: consecutive loads merge


def test_engine_refuses_host_pages_of_another_size() -> None:
    dev = PagedKVPool(8, 4, LAYERS, HKV, D, torch.float8_e4m3fn, "cpu")
    with pytest.raises(ValueError, match="do not match"):
        HostCopyEngine(dev, HostKVPool(8, 4, LAYERS, HKV, D, torch.bfloat16, pin=False))


def test_host_runs() -> None:
    assert host_runs(np.array([4, 5, 6, 9, 2, 3])) == [(4, 0, 3), (9, 3, 1), (2, 4, 2)]
    assert host_runs(np.array([], I32)) == []
