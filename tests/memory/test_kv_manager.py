"""KVManager: the request lifecycle over the radix cache, with copy-on-write.

World plays scheduler + worker: every KV write and page copy goes into a simulated pool, and after
every operation the full invariant (request refs as external refs), the tree's content and every live
request's content are checked.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from radixrt.memory.kv_manager import KVManager, ReqKV
from radixrt.memory.kv_sim import SimKVPool, check_world
from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import RadixCache

PAGE_SIZES = [1, 16, 64]


class World:
    def __init__(self, page_size: int, num_pages: int = 64, disable: bool = False) -> None:
        self.ps = page_size
        self.alloc = PageAllocator(num_pages)
        self.cache = RadixCache(self.alloc, page_size, disable=disable)
        self.mgr = KVManager(self.alloc, self.cache, page_size)
        self.pool = SimKVPool(page_size)
        self.live: dict[int, tuple[ReqKV, list[int]]] = {}  # id(kv) -> (kv, tokens)

    def check(self) -> None:
        self.pool.poison_free(self.alloc)
        check_world(self.mgr, self.pool, self.live.values())

    def admit(self, tokens: Sequence[int], reserve: int = 0) -> tuple[ReqKV, list[tuple[int, int]]] | None:
        out = self.mgr.admit(tokens, reserve)
        if out is not None:
            kv, cow = out
            self.pool.copy_pages(cow)
            self.live[id(kv)] = (kv, list(tokens))
        self.check()
        return out

    def run(self, kv: ReqKV, new_kv_len: int, tokens: Sequence[int] | None = None) -> list[int] | None:
        """reserve + the worker's write; tokens extends the request's known tokens if given."""
        if tokens is not None:
            self.live[id(kv)] = (kv, list(tokens))
        start = kv.kv_len
        slots = self.mgr.reserve(kv, new_kv_len)
        if slots is not None:
            assert len(slots) == new_kv_len - start and kv.kv_len == new_kv_len
            self.pool.write(slots, self.live[id(kv)][1], start, self.alloc)
        self.check()
        return slots

    def publish(self, kv: ReqKV) -> None:
        self.mgr.cache_unfinished_req(kv, self.live[id(kv)][1][: kv.kv_len])
        self.check()

    def finish(self, kv: ReqKV) -> None:
        _, tokens = self.live.pop(id(kv))
        self.mgr.cache_finished_req(kv, tokens[: kv.kv_len])
        assert kv.pages == [] and kv.last_node is None
        self.check()

    def release(self, kv: ReqKV) -> None:
        self.live.pop(id(kv))
        self.mgr.release(kv)
        self.check()

    def snapshot(self) -> tuple:
        return (self.alloc.free_pages(), [self.alloc.refcount(p) for p in range(1, self.alloc.num_pages)],
                self.cache.root.lock_ref, self.cache.evictable_size())

    def matched(self, tokens: Sequence[int]) -> int:
        return self.cache.match_prefix(tokens, record_stats=False).prefix_len


def seq(first: int, n: int) -> list[int]:
    return list(range(first, first + n))


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_fresh_request_lifecycle(ps: int) -> None:
    w = World(ps)
    prompt = seq(0, 2 * ps + 5)
    kv, cow = w.admit(prompt) or (None, None)
    assert kv is not None and cow == []
    assert (kv.cached_len, kv.kv_len, kv.pages, kv.last_node) == (0, 0, [], w.cache.root)
    slots = w.run(kv, len(prompt))
    assert slots is not None and len(set(slots)) == len(prompt) and min(slots) >= ps  # page 0 unused
    w.finish(kv)
    assert w.cache.protected_size() == 0
    assert w.cache.evictable_size() == -(-len(prompt) // ps)
    assert w.matched(prompt) == len(prompt)


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("extra", [5, 1])  # prefix (len - 1) ends mid-page / on a page boundary
def test_cached_prefix_with_copy_on_write(ps: int, extra: int) -> None:
    w = World(ps)
    prompt = seq(0, 2 * ps + extra)
    kv, _ = w.admit(prompt) or (None, None)
    assert kv is not None
    w.run(kv, len(prompt))
    w.finish(kv)
    kv2, cow = w.admit(prompt) or (None, None)
    assert kv2 is not None
    prefix = len(prompt) - 1  # the last prompt token is always computed
    assert kv2.cached_len == kv2.kv_len == prefix
    if prefix % ps:
        (src, dst), = cow
        assert src not in kv2.pages and kv2.pages[-1] == dst
        assert w.alloc.refcount(dst) == 1 and w.alloc.refcount(src) >= 1  # src still in the tree
    else:
        assert cow == []
    # Compute the last prompt token, then decode a few tokens into the (copied) page.
    w.run(kv2, len(prompt))
    out = prompt + seq(900, ps + 2)
    for n in range(len(prompt) + 1, len(out) + 1):
        w.run(kv2, n, out)
    w.finish(kv2)
    assert w.cache.protected_size() == 0
    assert w.matched(out) == len(out)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_unfinished_publishes_page_aligned_prefix_and_moves_lock(ps: int) -> None:
    w = World(ps)
    prompt = seq(0, 3 * ps + 5) if ps > 1 else seq(0, 7)
    kv, _ = w.admit(prompt) or (None, None)
    assert kv is not None
    w.run(kv, len(prompt))
    old_node = kv.last_node
    w.publish(kv)
    aligned = len(prompt) // ps * ps
    assert w.matched(prompt) == aligned and kv.published_len == aligned
    assert kv.last_node is not old_node and kv.last_node is not None and kv.last_node.end == aligned
    assert old_node is not None and old_node.own_lock_ref == 0 and kv.last_node.own_lock_ref == 1
    if ps > 1:
        assert w.alloc.refcount(kv.pages[-1]) == 1  # the partial page stays exclusive
    # A second request reuses the published part while the first keeps decoding.
    other, _ = w.admit(prompt[:aligned] + [777]) or (None, None)
    assert other is not None and other.cached_len == aligned
    out = prompt + seq(900, 2 * ps)
    for n in range(len(prompt) + 1, len(out) + 1):
        w.run(kv, n, out)
        w.publish(kv)
    w.cache.evict(w.alloc.num_total_pages)  # nothing the two requests lock may go
    w.check()
    assert w.matched(out) == len(out) // ps * ps
    w.finish(kv)
    w.release(other)
    assert w.cache.protected_size() == 0


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_concurrent_identical_prompts_keep_their_own_pages(ps: int) -> None:
    w = World(ps)
    prompt = seq(0, 2 * ps + 3)
    a, _ = w.admit(prompt) or (None, None)
    b, _ = w.admit(prompt) or (None, None)
    assert a is not None and b is not None and b.cached_len == 0
    w.run(a, len(prompt))
    w.run(b, len(prompt))
    w.publish(a)
    pages_b = list(b.pages)
    w.publish(b)  # already published by a: b's page table must not change (append-only)
    assert b.pages == pages_b and b.last_node is a.last_node
    w.finish(a)
    w.finish(b)
    tree_pages = -(-len(prompt) // ps)
    assert w.alloc.num_free_pages() == w.alloc.num_total_pages - tree_pages  # b's duplicates freed


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_admit_fails_cleanly_when_memory_is_short(ps: int) -> None:
    w = World(ps, num_pages=5)  # 4 pages
    cached = seq(0, 2 * ps + 1)
    kv, _ = w.admit(cached) or (None, None)
    assert kv is not None
    w.run(kv, len(cached))
    w.finish(kv)  # 3 pages in the tree, 1 free
    holder, _ = w.admit(seq(500, ps)) or (None, None)
    assert holder is not None
    w.run(holder, ps)  # 1 page held by a running request; 0 free, 3 evictable
    before = w.snapshot()
    assert w.admit(cached + seq(900, 2 * ps)) is None  # needs 2 more pages + maybe a COW copy
    assert w.snapshot() == before
    assert w.admit(seq(700, 3 * ps), reserve=ps) is None  # 4 pages > 3 evictable
    assert w.snapshot() == before
    ok, _ = w.admit(seq(700, 3 * ps)) or (None, None)  # fits by evicting the whole tree
    assert ok is not None
    assert w.run(ok, 3 * ps) is not None
    assert w.matched(cached) == 0
    w.release(ok)
    w.release(holder)
    assert w.cache.protected_size() == 0


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_reserve_evicts_lru_but_never_locked_and_fails_cleanly(ps: int) -> None:
    w = World(ps, num_pages=6)  # 5 pages
    old, new = seq(0, 2 * ps), seq(1000, 2 * ps)
    for tokens in (old, new):
        kv, _ = w.admit(tokens) or (None, None)
        assert kv is not None
        w.run(kv, len(tokens))
        w.finish(kv)
    # A request whose prefix (new) is locked, growing by 2 pages: only `old` may be evicted.
    runner, _ = w.admit(new + seq(5000, 2 * ps)) or (None, None)
    assert runner is not None and runner.cached_len == 2 * ps
    assert w.run(runner, 4 * ps) is not None
    assert w.matched(old) == 0 and w.matched(new) == 2 * ps
    before = (list(runner.pages), runner.kv_len, w.snapshot())
    assert w.run(runner, 4 * ps + 3 * ps) is None  # 3 more pages: only 2 left
    assert (runner.pages, runner.kv_len, w.snapshot()) == before
    w.release(runner)
    assert w.cache.protected_size() == 0


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_release_leaves_nothing_dangling(ps: int) -> None:
    w = World(ps)
    base = seq(0, 2 * ps + 3)
    kv, _ = w.admit(base) or (None, None)
    assert kv is not None
    w.run(kv, len(base))
    w.finish(kv)
    kv, _ = w.admit(base + seq(100, 3 * ps)) or (None, None)
    assert kv is not None
    total = list(base + seq(100, 3 * ps))
    w.run(kv, len(total) - ps)
    w.publish(kv)
    published = kv.published_len
    w.run(kv, len(total))
    w.release(kv)  # abort: publishes nothing more
    assert w.cache.protected_size() == 0
    assert w.matched(total) == published
    assert w.alloc.num_free_pages() + w.cache.evictable_size() == w.alloc.num_total_pages
    w.cache.evict(w.alloc.num_total_pages)
    assert w.alloc.num_free_pages() == w.alloc.num_total_pages
    w.check()


@pytest.mark.parametrize("ps", [1, 16])
def test_disabled_cache_still_serves(ps: int) -> None:
    w = World(ps, disable=True)
    prompt = seq(0, 2 * ps + 3)
    for _ in range(2):
        kv, cow = w.admit(prompt) or (None, None)
        assert kv is not None and kv.cached_len == 0 and cow == []
        w.run(kv, len(prompt))
        w.publish(kv)
        w.finish(kv)
        assert w.alloc.num_free_pages() == w.alloc.num_total_pages
    assert w.mgr.stats()["hit_rate"] == 0.0


def test_misuse_raises() -> None:
    w = World(4)
    with pytest.raises(ValueError):
        w.mgr.admit([])
    kv, _ = w.admit(seq(0, 6)) or (None, None)
    assert kv is not None
    w.run(kv, 6)
    with pytest.raises(ValueError):
        w.mgr.reserve(kv, 5)
    with pytest.raises(ValueError):
        w.mgr.cache_unfinished_req(kv, seq(0, 5))
    w.finish(kv)
    with pytest.raises(ValueError):
        w.mgr.reserve(kv, 8)
    w.mgr.release(kv)  # releasing twice is harmless
    w.check()
    with pytest.raises(ValueError):
        KVManager(w.alloc, w.cache, 8)


def test_stats_report_accounting_and_hit_rate() -> None:
    w = World(4, num_pages=17)
    prompt = seq(0, 10)
    kv, _ = w.admit(prompt) or (None, None)
    assert kv is not None
    w.run(kv, 10)
    w.finish(kv)
    kv, _ = w.admit(prompt) or (None, None)
    assert kv is not None
    s = w.mgr.stats()
    assert s["num_total_pages"] == 16
    assert s["num_free_pages"] + s["num_evictable_pages"] + s["num_protected_pages"] == 16
    assert s["num_protected_pages"] == 4  # 3 locked tree pages + the request's COW copy
    assert s["total_matched_tokens"] == 9 and s["total_queried_tokens"] == 18
    assert s["hit_rate"] == pytest.approx(0.5)
    w.release(kv)


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_publishing_with_the_whole_token_list_equals_publishing_the_computed_ones(ps: int) -> None:
    """cache_unfinished_req takes the request's whole token list (the scheduler passes all_ids, no
    copy): tokens past kv_len, not computed yet, are ignored; fewer than kv_len tokens is an error."""
    worlds = [World(ps, num_pages=200) for _ in range(2)]
    prompt = seq(0, 3 * ps + 3)
    for w in worlds:  # a cached prefix to start on
        kv, _ = w.admit(prompt[:2 * ps + 1]) or (None, None)
        assert kv is not None
        w.run(kv, 2 * ps + 1)
        w.finish(kv)
    kvs = []
    for k, w in enumerate(worlds):
        kv, _ = w.admit(prompt) or (None, None)
        assert kv is not None
        w.run(kv, len(prompt) - 2)
        tokens = w.live[id(kv)][1]
        w.mgr.cache_unfinished_req(kv, tokens if k == 0 else tokens[:kv.kv_len])
        w.check()
        kvs.append(kv)
    assert worlds[0].snapshot() == worlds[1].snapshot()
    assert kvs[0].published_len == kvs[1].published_len == (len(prompt) - 2) // ps * ps
    assert worlds[0].matched(prompt) == worlds[1].matched(prompt)
    with pytest.raises(ValueError):
        worlds[0].mgr.cache_unfinished_req(kvs[0], prompt[:kvs[0].kv_len - 1])


@pytest.mark.parametrize("ps", [1, 4])
def test_finishing_with_end_equals_finishing_with_the_slice(ps: int) -> None:
    """cache_finished_req(kv, tokens, end) publishes tokens[:end] (cut to the list as a slice is):
    the same tree and counts as passing the slice; more tokens than kv_len is an error."""
    worlds = [World(ps, num_pages=200) for _ in range(2)]
    tokens = seq(0, 4 * ps + 3)
    for k, w in enumerate(worlds):
        kv, _ = w.admit(tokens) or (None, None)
        assert kv is not None
        w.run(kv, len(tokens) - 1)
        w.live.pop(id(kv))
        if k == 0:
            w.mgr.cache_finished_req(kv, tokens, end=kv.kv_len)
        else:
            w.mgr.cache_finished_req(kv, tokens[:kv.kv_len])
        w.check()
    assert worlds[0].snapshot() == worlds[1].snapshot()
    assert worlds[0].matched(tokens) == worlds[1].matched(tokens) == len(tokens) - 1
    kv, _ = worlds[0].admit(seq(100, 2 * ps + 1)) or (None, None)
    assert kv is not None
    worlds[0].run(kv, 2 * ps)
    with pytest.raises(ValueError):
        worlds[0].mgr.cache_finished_req(kv, seq(100, 2 * ps + 1), end=2 * ps + 1)
    worlds[0].mgr.cache_finished_req(kv, seq(100, 2 * ps), end=10 * ps)  # cut to the 2 * ps given
    worlds[0].live.pop(id(kv))
    worlds[0].check()
    assert worlds[0].matched(seq(100, 2 * ps + 1)) == 2 * ps
