"""KV memory bookkeeping: reference-counted pages, the radix prefix cache, per-request page tables.

page_allocator  PageAllocator: page ids, reference counts, free list (page 0 reserved)
radix_cache     RadixCache, TreeNode, MatchResult, MatchHint: token-granularity radix tree over pages, LRU eviction
req_kv          ReqKV, KVManager: admit / reserve / publish / release / fork with copy-on-write
invariants      the memory invariant, checked from scratch
kv_sim          SimKVPool: simulated KV contents for CPU tests

See docs/memory.md.
"""

from __future__ import annotations

from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import MatchHint, MatchResult, RadixCache, TreeNode
from radixrt.memory.req_kv import KVManager, ReqKV

__all__ = ["KVManager", "MatchHint", "MatchResult", "PageAllocator", "RadixCache", "ReqKV", "TreeNode"]
