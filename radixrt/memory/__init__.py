"""KV memory bookkeeping: reference-counted pages, the radix prefix cache, per-request page tables.

page_allocator  PageAllocator: page ids, reference counts, free list (page 0 reserved)
radix_cache     RadixCache, TreeNode, MatchResult, MatchHint: token-granularity radix tree over pages,
                LRU eviction
kv_manager      KVManager, ReqKV, PrefixHandle: the scheduler's entry point; admit / reserve / publish /
                release with copy-on-write, lpm probe, flush, invariant check
invariants      the memory invariant, checked from scratch
kv_sim          SimKVPool: simulated KV contents for CPU tests

See docs/memory.md.
"""

from __future__ import annotations

from radixrt.memory.kv_manager import KVManager, PrefixHandle, ReqKV
from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import MatchHint, MatchResult, RadixCache, TreeNode

__all__ = ["KVManager", "MatchHint", "MatchResult", "PageAllocator", "PrefixHandle", "RadixCache", "ReqKV",
           "TreeNode"]
