"""Edge rules of RadixCache's fast paths (MatchHint, token bytes), each against the plain walk.

- token bytes: a tree key holding a token outside int64 has no int64 bytes form; a match given
  token_bytes must then compare that key as ints (it raised OverflowError), and int64 edge values
  and negative ids must compare as the ints do;
- hints: a full match (prefix_len == query length) stays valid when the tree grows past the query;
  a child on another token, or on the next token that is evicted again, leaves the hint's answer
  equal to a walk's; a request retracted before any output (same tokens, same query length) sees
  the prefix it published from its locked node.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from radixrt.memory.kv_manager import KVManager, PrefixHandle
from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import MatchHint, RadixCache


def as_bytes(tokens: Sequence[int]) -> bytes:
    return np.array(tokens, np.int64).tobytes()


def put(cache: RadixCache, tokens: Sequence[int]) -> None:
    pages = cache.allocator.alloc(-(-len(tokens) // cache.page_size))
    assert pages is not None
    cache.insert(tokens, pages)
    cache.allocator.dec_ref(pages)


def same_as_walk(cache: RadixCache, q: list[int], n: int, hint: MatchHint) -> int:
    """Hinted + bytes match of q[:n], checked against a plain walk of a copy; returns prefix_len."""
    got = cache.match_prefix(q, end=n, hint=hint, token_bytes=as_bytes(q))
    want = cache.match_prefix(list(q[:n]))
    assert (got.prefix_len, got.pages, got.last_node) == (want.prefix_len, want.pages, want.last_node)
    return got.prefix_len


@pytest.mark.parametrize("odd", [2**63, -2**63 - 1, 2**64 + 5])
@pytest.mark.parametrize("ps", [1, 4])
def test_bytes_compare_with_a_key_token_outside_int64(odd: int, ps: int) -> None:
    cache = RadixCache(PageAllocator(32), ps)
    put(cache, [1, 2, odd, 3, 4])  # a key whose int64 bytes cannot be built
    q = [1, 2, 5, 7, 8]
    m = cache.match_prefix(q, token_bytes=as_bytes(q))  # raised OverflowError
    assert m.prefix_len == 2 and m.pages == cache.match_prefix(q).pages
    put(cache, [9, odd, 4, 4])
    q = [9, 6, 6]
    assert cache.match_prefix(q, token_bytes=as_bytes(q), hint=MatchHint()).prefix_len == 1
    cache.check_invariants()


def test_bytes_compare_of_int64_edges_and_negative_ids_equals_the_int_compare() -> None:
    cache = RadixCache(PageAllocator(32), 2)
    key = [2**63 - 1, -2**63, -1, 0, -5]
    put(cache, key)
    for q in (key + [1], key[:3] + [-2, 1], [2**63 - 1, -2**63 + 1, 7]):
        m = cache.match_prefix(q, token_bytes=as_bytes(q))
        want = cache.match_prefix(list(q))
        assert (m.prefix_len, m.pages, m.last_node) == (want.prefix_len, want.pages, want.last_node)
    cache.check_invariants()


@pytest.mark.parametrize("ps", [1, 16])
def test_full_match_hint_holds_while_the_tree_grows_past_the_query(ps: int) -> None:
    cache = RadixCache(PageAllocator(64), ps)
    a = list(range(1, 31))
    put(cache, a[:20])
    hint = MatchHint()
    assert same_as_walk(cache, a, 20, hint) == 20  # the whole query is cached: prefix_len == n
    put(cache, a)  # a child under the hinted node, on the token after the query
    assert same_as_walk(cache, a, 20, hint) == 20
    assert hint.last_node is not None and hint.last_node.end == 20
    assert same_as_walk(cache, a, 25, hint) == 25  # a longer query of the same tokens walks


@pytest.mark.parametrize("ps", [1, 4])
def test_hint_after_a_child_on_another_token_and_an_evicted_extension(ps: int) -> None:
    cache = RadixCache(PageAllocator(64), ps)
    a = list(range(1, 21))
    put(cache, a)
    q = a[:10] + [50, 51, 52]
    hint = MatchHint()
    assert same_as_walk(cache, q, len(q), hint) == 10
    put(cache, a[:10] + [60, 61])  # a sibling on another token: the hint still holds
    assert same_as_walk(cache, q, len(q), hint) == 10
    put(cache, q[:12])  # the query's own next token: the match grows
    assert same_as_walk(cache, q, len(q), hint) == 12
    node = hint.last_node
    cache.evict(1)  # LRU leaves first: the other branches go, q's path (just matched) stays
    while node is not None and node.parent is not None:
        cache.evict(1)  # until the hinted node is gone
    assert same_as_walk(cache, q, len(q), hint) < 12
    cache.check_invariants()


@pytest.mark.parametrize("ps", [1, 4])
def test_retracted_before_any_output_sees_what_it_published(ps: int) -> None:
    """A request admitted with a hint, prefilled in part, retracted with no output: the same tokens
    and query length come back, and the hint must follow what it published from its locked node."""
    alloc = PageAllocator(64)
    cache = RadixCache(alloc, ps)
    kvm = KVManager(alloc, cache, ps)
    shared = list(range(100, 107))
    put(cache, shared)
    prompt = shared + list(range(200, 223))
    hint = MatchHint()
    handle = PrefixHandle(hint, as_bytes(prompt))  # the test keeps the hint inside the handle
    got = kvm.admit(prompt, handle=handle)
    assert got is not None and got[0].kv_len == 7
    kv = got[0]
    assert kvm.reserve(kv, 17) is not None
    kvm.cache_unfinished_req(kv, prompt)  # publishes floor(17 / ps) * ps tokens from the locked node
    assert kvm.reserve(kv, 19) is not None
    kvm.cache_finished_req(kv, prompt, end=kv.kv_len)  # retraction: 19 tokens published
    assert same_as_walk(cache, prompt, len(prompt) - 1, hint) == 19
    again = kvm.admit(prompt, handle=handle)
    assert again is not None and again[0].kv_len == 19
    kvm.release(again[0])
    cache.check_invariants(kvm.external_refs([]))
