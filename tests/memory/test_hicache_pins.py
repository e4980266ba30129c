"""Load pins: a prefix loaded back from the host tier stays on the device until its request runs."""

from __future__ import annotations

import numpy as np

from radixrt.memory.kv_manager import LOAD_AHEAD_FRACTION, KVManager, PrefixHandle

PS = 4


def _mgr(device_pages: int) -> KVManager:
    return KVManager.create(device_pages + 1, PS, num_host_pages=400, write_policy="write_through")


def _handle(mgr: KVManager, prompt: list[int]) -> PrefixHandle:
    return mgr.prefix_handle(np.array(prompt, np.int64))


def _finish_copies(mgr: KVManager) -> None:
    mgr.take_copy_ops()
    mgr.copies_done(list(mgr._tier.in_flight))  # type: ignore[union-attr]


def _serve(mgr: KVManager, prompt: list[int]) -> int:
    """Admit, compute and finish prompt (no load expected); returns its cached_len."""
    h = _handle(mgr, prompt)
    assert mgr.prepare_load(prompt, h)
    kv, _ = mgr.admit(prompt, handle=h)  # type: ignore[misc]
    assert mgr.reserve(kv, len(prompt)) is not None
    mgr.cache_finished_req(kv, prompt)
    _finish_copies(mgr)
    return kv.cached_len


def _conv(c: int, n: int) -> list[int]:
    return [1000 * (c + 1) + i for i in range(n)]


def _to_host(mgr: KVManager, convs: list[int], n: int) -> None:
    """Serve conversations (stored to the host by write_through), then evict all from the device."""
    for c in convs:
        _serve(mgr, _conv(c, n))
    mgr._cache.evict(10**6)
    assert mgr.num_available_pages() == mgr._allocator.num_total_pages


def _load(mgr: KVManager, prompt: list[int]) -> PrefixHandle:
    h = _handle(mgr, prompt)
    assert not mgr.prepare_load(prompt, h), "a load should have been ordered"
    _finish_copies(mgr)
    assert mgr.prepare_load(prompt, h), "the load is done"
    return h


def test_eviction_cannot_take_a_loaded_prefix_before_its_request_runs() -> None:
    mgr = _mgr(device_pages=12)
    _to_host(mgr, [0, 1], 32)  # 8 pages each, both host only now
    a = _conv(0, 32) + [7, 7]
    ha = _load(mgr, a)
    loaded = mgr._tier.num_loaded_pages  # type: ignore[union-attr]
    mgr._cache.evict(10**6)  # as another request's load or admission would: A's pages stay
    b = _conv(1, 32) + [7, 7]
    hb = _handle(mgr, b)
    assert not mgr.prepare_load(b, hb) and hb._load is None  # waits: A's pin fills the load-ahead cap
    kv, _ = mgr.admit(a, handle=ha)  # type: ignore[misc]
    assert kv.cached_len == 32 and mgr._tier.num_loaded_pages == loaded  # type: ignore[union-attr]
    assert mgr.stats()["hicache_pinned_load_pages"] == 8
    mgr.release(kv)  # e.g. the scheduler's headroom check failed: the pin stays with the waiting request
    assert ha._load is not None and mgr.prepare_load(a, ha)
    kv, _ = mgr.admit(a, handle=ha)  # type: ignore[misc]
    assert mgr.reserve(kv, len(a)) is not None  # running now: its own lock protects the prefix
    assert ha._load is None and kv.pin_handle is None and mgr.stats()["hicache_pinned_load_pages"] == 0
    mgr.cache_finished_req(kv, a)
    assert mgr.stats()["hicache_unpinned_load_pages"] == 0


def test_loads_ahead_of_admission_are_capped() -> None:
    mgr = _mgr(device_pages=64)
    _to_host(mgr, list(range(6)), 32)  # 6 x 8 pages on the host
    handles = [(p := _conv(c, 32) + [5], _handle(mgr, p)) for c in range(6)]
    for p, h in handles:
        mgr.prepare_load(p, h)
    pinned = sum(h._load.num_pages for _, h in handles if h._load is not None)
    assert pinned == mgr.stats()["hicache_pinned_load_pages"]
    assert 8 <= pinned <= max(8, LOAD_AHEAD_FRACTION * 64)  # 2 loads of 8 pages fit under 16
    assert [h._load is not None for _, h in handles] == [True, True, False, False, False, False]


def test_running_requests_and_a_lone_admission_take_pinned_pages_back() -> None:
    mgr = _mgr(device_pages=12)
    _to_host(mgr, [0], 32)
    a = _conv(0, 32) + [7]
    ha = _load(mgr, a)  # 8 of the 12 pages pinned, nothing running
    big = _conv(5, 40)  # 10 pages: only with A's pinned pages
    kv, _ = mgr.admit(big, handle=_handle(mgr, big))  # type: ignore[misc]  # nothing else runs: unpins A
    assert ha._load is None and mgr.stats()["hicache_unpinned_load_pages"] == 8
    assert mgr.reserve(kv, len(big)) is not None
    mgr.cache_finished_req(kv, big)
    _finish_copies(mgr)
    mgr._cache.evict(10**6)
    # a running request's reserve unpins a finished load too
    small = _conv(6, 8)
    kv, _ = mgr.admit(small, handle=_handle(mgr, small))  # type: ignore[misc]
    assert mgr.reserve(kv, 8) is not None
    ha = _load(mgr, a)
    assert ha._load is not None
    assert mgr.reserve(kv, 8 + 4 * PS) is not None  # needs 4 more pages: 2 free, 2 from A's pin
    assert ha._load is None and mgr.stats()["hicache_unpinned_load_pages"] == 16
