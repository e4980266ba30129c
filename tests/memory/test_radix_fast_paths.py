"""RadixCache fast paths against the plain walk: match hints (MatchHint), walks that start at a
locked node (insert's `start`), `end` instead of a copied token list, and token compares as bytes.

A fast path must give exactly what the plain walk gives: the same match and pages, the same tree
(splits included), the same LRU times, the same reference counts and hit-rate counters. The
lockstep test drives two caches through the same random operations, one through the fast paths and
one through the plain walk, and compares everything after every operation. The invalidation tests
each change the tree in one way that must make a hint stale, and check that the match follows.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest

from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import MatchHint, RadixCache, TreeNode, _common_prefix_len


def as_bytes(tokens: Sequence[int]) -> bytes:
    return np.array(tokens, np.int64).tobytes()


def snapshot(cache: RadixCache) -> tuple:
    """Everything a fast path must leave as the plain walk does."""
    alloc = cache.allocator
    nodes = sorted((n.start, n.key, tuple(n.pages), n.lock_ref, n.own_lock_ref, n.last_access_time)
                   for n in cache.iter_nodes())
    refs = [(alloc.refcount(p), alloc.reclaimable_refs(p)) for p in range(1, alloc.num_pages)]
    return (nodes, refs, alloc.free_pages(), cache.root.last_access_time, cache.total_queried_tokens,
            cache.total_matched_tokens, cache.evictable_size())


def span(node: TreeNode) -> tuple[int, int]:
    return node.start, node.end


def put(cache: RadixCache, tokens: Sequence[int]) -> None:
    """Insert tokens as a finished request does (fresh pages, the caller's refs dropped after)."""
    pages = cache.allocator.alloc(-(-len(tokens) // cache.page_size))
    assert pages is not None
    cache.insert(tokens, pages)
    cache.allocator.dec_ref(pages)


def random_queries(rng: random.Random) -> list[list[int]]:
    """Prefixes of three bases plus own tails, so matches end anywhere."""
    bases = [[rng.randrange(1, 50) for _ in range(rng.randrange(20, 60))] for _ in range(3)]
    queries = []
    for _ in range(12):
        base = rng.choice(bases)
        tail = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 20))]
        queries.append(base[:rng.randrange(1, len(base))] + tail)
    return queries


def count_walks(caches: dict[str, RadixCache]) -> dict[str, int]:
    """Count each cache's tree walks (RadixCache._walk calls) from now on, by name."""
    walks = dict.fromkeys(caches, 0)
    for name, cache in caches.items():
        walk = cache._walk

        def counted(*a, _walk=walk, _name=name, **k):  # type: ignore[no-untyped-def]
            walks[_name] += 1
            return _walk(*a, **k)

        cache._walk = counted  # type: ignore[method-assign]
    return walks


def publish_from_lock(fast: RadixCache, slow: RadixCache, q: list[int], hint: MatchHint,
                      rng: random.Random) -> None:
    """A running request publishes more of its tokens: fast walks from its locked node."""
    ps = fast.page_size
    got = fast.match_prefix(q, end=len(q) - 1, hint=hint, token_bytes=as_bytes(q))
    want = slow.match_prefix(q[:-1])
    fast.inc_lock_ref(got.last_node)
    slow.inc_lock_ref(want.last_node)
    cut = rng.randrange(got.prefix_len, len(q)) + 1
    pages_f = fast.allocator.alloc(-(-cut // ps))
    pages_s = slow.allocator.alloc(-(-cut // ps))
    assert pages_f == pages_s and pages_f is not None
    node_f = fast.insert_path(q, pages_f, start=got.last_node, end=cut)
    node_s = slow.insert_path(q[:cut], pages_s)
    assert span(node_f) == span(node_s) == (node_f.start, cut)
    fast.allocator.dec_ref(pages_f)
    slow.allocator.dec_ref(pages_s)
    fast.dec_lock_ref(got.last_node)
    slow.dec_lock_ref(want.last_node)


@pytest.mark.parametrize("ps", [1, 4, 16])
@pytest.mark.parametrize("seed", range(6))
def test_fast_paths_match_the_plain_walk_in_lockstep(ps: int, seed: int) -> None:
    rng = random.Random(seed * 31 + ps)
    fast = RadixCache(PageAllocator(400), ps)
    slow = RadixCache(PageAllocator(400), ps)
    queries = random_queries(rng)
    hints = [MatchHint() for _ in queries]
    locked: list[tuple[TreeNode, TreeNode]] = []  # (fast node, slow node) locked by a "running request"
    walks = count_walks({"fast": fast, "slow": slow})
    for _ in range(250):
        op = rng.random()
        i = rng.randrange(len(queries))
        q = queries[i]
        if op < 0.45:  # an LPM probe or an admission: hinted, bytes, no copy of the tokens
            record = rng.random() < 0.5
            got = fast.match_prefix(q, end=len(q) - 1, record_stats=record, hint=hints[i],
                                    token_bytes=as_bytes(q))
            want = slow.match_prefix(q[:-1], record_stats=record)
            assert (got.prefix_len, got.pages, span(got.last_node)) == (want.prefix_len, want.pages,
                                                                        span(want.last_node))
            assert hints[i].last_node is got.last_node and hints[i].prefix_len == got.prefix_len
            if rng.random() < 0.3 and got.prefix_len:  # a request keeps it locked for a while
                fast.inc_lock_ref(got.last_node)
                slow.inc_lock_ref(want.last_node)
                locked.append((got.last_node, want.last_node))
        elif op < 0.65:
            publish_from_lock(fast, slow, q, hints[i], rng)
        elif op < 0.8 and locked:
            node_f, node_s = locked.pop(rng.randrange(len(locked)))
            fast.dec_lock_ref(node_f)
            slow.dec_lock_ref(node_s)
        elif op < 0.95:
            k = rng.randrange(1, 12)
            assert fast.evict(k) == slow.evict(k)
        elif not locked:
            fast.reset()
            slow.reset()
        assert snapshot(fast) == snapshot(slow)
        fast.check_invariants()
    assert walks["fast"] < walks["slow"], "the hints never saved a walk"


def test_a_valid_hint_skips_the_walk_and_keeps_its_side_effects() -> None:
    cache = RadixCache(PageAllocator(64), 4)
    a = list(range(1, 21))
    put(cache, a)
    q = a[:12] + [99, 98]
    hint = MatchHint()
    first = cache.match_prefix(q, hint=hint)
    assert first.prefix_len == 12
    clock = cache.root.last_access_time

    def no_walk(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("walked although the hint holds")

    cache._walk = no_walk  # type: ignore[method-assign]
    again = cache.match_prefix(q, record_stats=True, hint=hint)
    assert (again.prefix_len, again.pages, again.last_node) == (12, first.pages, first.last_node)
    node: TreeNode | None = again.last_node
    while node is not None:  # the path was refreshed as a walk refreshes it
        assert node.last_access_time == clock + 1
        node = node.parent
    assert (cache.total_queried_tokens, cache.total_matched_tokens) == (len(q), 12)


@pytest.mark.parametrize("ps", [1, 4])
def test_hint_follows_an_insert_that_extends_the_match(ps: int) -> None:
    cache = RadixCache(PageAllocator(64), ps)
    a = list(range(1, 21))
    put(cache, a)
    q = a[:6] + [50, 51, 52, 53]
    hint = MatchHint()
    assert cache.match_prefix(q, hint=hint).prefix_len == 6
    put(cache, q[:8])  # a child under the hinted node, on q's next token
    m = cache.match_prefix(q, hint=hint, token_bytes=as_bytes(q))
    assert m.prefix_len == 8 and m.last_node.end == 8 and hint.prefix_len == 8
    assert cache.match_prefix(q).pages == m.pages


@pytest.mark.parametrize("ps", [1, 4])
def test_hint_follows_eviction_and_flush(ps: int) -> None:
    cache = RadixCache(PageAllocator(64), ps)
    a = list(range(1, 21))
    put(cache, a)
    hint = MatchHint()
    assert cache.match_prefix(a, hint=hint).prefix_len == 20
    cache.evict(100)
    m = cache.match_prefix(a, hint=hint)
    assert m.prefix_len == 0 and m.last_node is cache.root and m.pages == []
    put(cache, a)
    assert cache.match_prefix(a, hint=hint).prefix_len == 20
    cache.reset()
    assert cache.match_prefix(a, hint=hint).prefix_len == 0
    put(cache, a[:5])
    assert cache.match_prefix(a, hint=hint).prefix_len == 5  # a hint at the root sees new children


def test_hint_survives_a_split_above_it_with_the_same_pages() -> None:
    cache = RadixCache(PageAllocator(64), 4)
    a = list(range(1, 21))
    put(cache, a)
    q = a + [60, 61]
    hint = MatchHint()
    before = cache.match_prefix(q, hint=hint)
    assert before.prefix_len == 20
    put(cache, a[:6] + [70, 71, 72])  # splits the node of `a` at 6, inside a page
    after = cache.match_prefix(q, hint=hint)
    assert after.last_node is before.last_node and after.prefix_len == 20
    assert after.pages == before.pages == cache.match_prefix(q).pages


def test_hint_for_other_tokens_walks() -> None:
    cache = RadixCache(PageAllocator(64), 4)
    a = list(range(1, 21))
    put(cache, a)
    hint = MatchHint()
    assert cache.match_prefix(a[:10], hint=hint).prefix_len == 10
    assert cache.match_prefix(a, hint=hint).prefix_len == 20  # another length: not the same query


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_insert_from_a_start_node_and_end(ps: int) -> None:
    rng = random.Random(ps)
    tokens = [rng.randrange(1, 9) for _ in range(70)]
    caches = [RadixCache(PageAllocator(200), ps) for _ in range(2)]
    for cache in caches:
        put(cache, tokens[:23])
        put(cache, tokens[:5] + [40, 41])
    pages = [c.allocator.alloc(-(-60 // ps)) for c in caches]
    start = caches[0].match_prefix(tokens, end=23).last_node
    caches[1].match_prefix(tokens[:23])  # the same lookup (same clock and splits)
    node_a = caches[0].insert_path(tokens, pages[0], start=start, end=60)
    node_b = caches[1].insert_path(tokens[:60], pages[1])
    assert span(node_a) == span(node_b) == (23, 60)
    assert snapshot(caches[0]) == snapshot(caches[1])
    assert caches[0].insert(tokens, pages[0], start=node_a, end=40) == 40  # already there
    with pytest.raises(ValueError):
        caches[0].insert(tokens, pages[0], end=71)
    with pytest.raises(ValueError):
        caches[0].match_prefix(tokens, end=71)


def test_bytes_compare_and_split_keep_key_bytes_right() -> None:
    cache = RadixCache(PageAllocator(64), 4)
    a = [1000 + i for i in range(30)]
    put(cache, a)
    m = cache.match_prefix(a, token_bytes=as_bytes(a))  # builds the node's key_bytes
    assert m.prefix_len == 30 and m.last_node.key_bytes == as_bytes(a)
    b = a[:13] + [7, 8, 9]
    assert cache.match_prefix(b, token_bytes=as_bytes(b)).prefix_len == 13  # splits at 13
    cache.check_invariants()  # checks key_bytes against the (split) keys
    upper = cache.root.children[a[0]]
    assert upper.key_bytes == as_bytes(a[:13]) and upper.children[a[13]].key_bytes == as_bytes(a[13:])
    assert cache.match_prefix(a, token_bytes=as_bytes(a[:20])).prefix_len == 30  # bytes for a prefix only


def test_common_prefix_len_equals_the_naive_scan() -> None:
    rng = random.Random(0)
    for _ in range(3000):
        key = tuple(rng.randrange(3) for _ in range(rng.randrange(1, 120)))
        tokens = [rng.randrange(3) for _ in range(rng.randrange(0, 10))]
        tokens += list(key[:rng.randrange(0, len(key) + 1)])
        tokens += [rng.randrange(3) for _ in range(rng.randrange(0, 70))]
        pos = rng.randrange(0, len(tokens) + 1)
        n = rng.randrange(pos, len(tokens) + 1)
        want = 0
        while want < min(len(key), n - pos) and key[want] == tokens[pos + want]:
            want += 1
        assert _common_prefix_len(key, tokens, pos, n) == want
        assert _common_prefix_len(key, tuple(tokens), pos, n) == want
