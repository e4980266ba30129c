"""cache_salt namespaces of the radix tree (KVManager.prefix_handle): same prompt, different salt:
no KV shared; same salt: shared; the shared namespace never sees a salted prefix. The full memory
invariant and the simulated pool's content are checked after every operation."""

from __future__ import annotations

import numpy as np
import pytest

from radixrt.memory.kv_manager import KVManager, ReqKV
from radixrt.memory.kv_sim import SimKVPool, check_world
from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import RadixCache


class World:
    def __init__(self, page_size: int, num_pages: int = 256) -> None:
        self.alloc = PageAllocator(num_pages)
        self.cache = RadixCache(self.alloc, page_size)
        self.mgr = KVManager(self.alloc, self.cache, page_size)
        self.pool = SimKVPool(page_size)
        self.live: list[tuple[ReqKV, list[int]]] = []

    def check(self) -> None:
        self.pool.poison_free(self.alloc)
        check_world(self.mgr, self.pool, [(kv, t) for kv, t in self.live if kv.active])

    def run_request(self, tokens: list[int], salt: str | None, finish: bool = True) -> ReqKV:
        """Admit, compute the rest of the prompt, publish it whole; returns the (finished) kv."""
        handle = self.mgr.prefix_handle(np.asarray(tokens), salt)
        got = self.mgr.admit(tokens, handle=handle)
        assert got is not None
        kv, cow = got
        self.pool.copy_pages(cow)
        self.live.append((kv, tokens))
        start = kv.kv_len
        slots = self.mgr.reserve(kv, len(tokens))
        assert slots is not None
        self.pool.write(slots, tokens, start, self.alloc)
        self.check()
        self.mgr.cache_unfinished_req(kv, tokens)
        self.check()
        if finish:
            self.mgr.cache_finished_req(kv, tokens)
            self.check()
        return kv

    def probe(self, tokens: list[int], salt: str | None) -> int:
        return self.mgr.cached_prefix_len(tokens, self.mgr.prefix_handle(np.asarray(tokens), salt))


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_salts_do_not_share_and_same_salt_shares(page_size: int) -> None:
    w = World(page_size)
    prompt = list(range(100, 140))
    assert w.run_request(prompt, "tenant-a").cached_len == 0
    assert w.run_request(prompt, "tenant-b").cached_len == 0  # same prompt, other salt: nothing
    assert w.run_request(prompt, None).cached_len == 0  # the shared namespace saw no salted prefix
    assert w.run_request(prompt, "tenant-a").cached_len == len(prompt) - 1  # same salt shares
    assert w.run_request(prompt, None).cached_len == len(prompt) - 1
    assert w.probe(prompt, "tenant-c") == 0 and w.probe(prompt, "tenant-b") == len(prompt) - 1


def test_partial_overlap_and_running_requests_stay_apart() -> None:
    w = World(4)
    base = list(range(1, 30))
    a = w.run_request(base + [7, 8, 9], "a", finish=False)  # still running, prefix published
    assert w.probe(base + [5], "a") == len(base)
    assert w.probe(base + [5], "b") == 0 and w.probe(base + [5], None) == 0
    w.mgr.cache_finished_req(a, base + [7, 8, 9], end=len(base))  # retract-like: publish less
    w.check()
    assert w.probe(base + [5], None) == 0  # nothing leaked into the shared namespace


def test_namespaces_are_evicted_and_flushed_like_any_prefix() -> None:
    w = World(4, num_pages=24)  # 23 usable pages: room for ~2 prompts of 40 tokens
    for i in range(6):  # each salt's prefix pushes older ones out under memory pressure
        w.run_request([1000 + i] + list(range(39)), f"s{i}")
    assert w.cache.num_evicted_tokens > 0
    w.check()
    w.mgr.flush()
    w.check()
    assert not w.cache.root.children
    assert w.run_request(list(range(40)), "s5").cached_len == 0


def test_disabled_cache_ignores_salts() -> None:
    alloc = PageAllocator(16)
    mgr = KVManager(alloc, RadixCache(alloc, 4, disable=True), 4)
    got = mgr.admit([1, 2, 3], handle=mgr.prefix_handle(np.asarray([1, 2, 3]), "x"))
    assert got is not None and got[0].cached_len == 0
    mgr.check_invariants([got[0]])
