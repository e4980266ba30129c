"""Order in which waiting requests are admitted.

`lpm` (longest prefix match first), as in SGLang's RadixAttention paper (Zheng et al., 2023, §4):
sorting the waiting queue by how many of its tokens are already cached raises the hit rate, since
requests that reuse resident KV run before that KV is evicted. Matching costs a tree walk per
request, so past `LPM_MAX_QUEUE` waiting requests the order falls back to FCFS.

In-step sharing: among waiting requests that share a prefix which is NOT cached yet, only the first
is admitted in a step; the rest wait one step and then hit the cache that the first one published
(`defer_for_shared_prefix`).
"""

from __future__ import annotations

from collections.abc import Sequence

from radixrt.memory.radix_cache import RadixCache
from radixrt.scheduler.req import Req

LPM_MAX_QUEUE = 128
SHARED_PREFIX_MIN_TOKENS = 32


def order_waiting(waiting: Sequence[Req], policy: str, cache: RadixCache) -> list[Req]:
    """Return the waiting requests in admission order (stable: ties keep arrival order)."""
    if policy == "fcfs" or len(waiting) > LPM_MAX_QUEUE:
        return list(waiting)
    if policy != "lpm":
        raise ValueError(f"unknown schedule policy {policy!r}")
    matched = {id(r): cache.match_prefix(r.all_ids[:-1]).prefix_len for r in waiting}
    return sorted(waiting, key=lambda r: -matched[id(r)])


def defer_for_shared_prefix(candidate: Req, cached_len: int, admitted: Sequence[Req]) -> bool:
    """True if `candidate` shares an uncached prefix (>= SHARED_PREFIX_MIN_TOKENS beyond what is
    cached) with a request admitted in this step: it should wait and reuse that request's KV."""
    n = cached_len + SHARED_PREFIX_MIN_TOKENS
    ids = candidate.all_ids
    if len(ids) < n:
        return False
    first_new, last = ids[cached_len], ids[n - 1]
    for other in admitted:
        o = other.all_ids
        # two cheap probes before the full compare (a slice copy each: O(n)); with many requests
        # sharing a cached prefix, the first uncached token already tells them apart
        if len(o) >= n and o[cached_len] == first_new and o[n - 1] == last and o[:n] == ids[:n]:
            return True
    return False
