"""Order in which waiting requests are admitted.

`lpm` (longest prefix match first), as in SGLang's RadixAttention paper (Zheng et al., 2023, §4):
sorting the waiting queue by how many of its tokens are already cached raises the hit rate, since
requests that reuse resident KV run before that KV is evicted. Matching costs a tree walk per
request, so past `LPM_MAX_QUEUE` waiting requests the order falls back to FCFS. The probe is the KV
manager's (`KVManager.cached_prefix_len`); through each request's `PrefixHandle` a request whose match
the tree cannot have changed costs a walk up its matched path, not a compare of its tokens.

In-step sharing: among waiting requests that share a prefix which is NOT cached yet, only the first
is admitted in a step; the rest wait one step and then hit the cache that the first one published
(`defer_for_shared_prefix`).
"""

from __future__ import annotations

from collections.abc import Sequence

from radixrt.memory.kv_manager import KVManager
from radixrt.scheduler.req import Req

LPM_MAX_QUEUE = 128
SHARED_PREFIX_MIN_TOKENS = 32


def order_waiting(waiting: Sequence[Req], policy: str, kv: KVManager) -> list[Req]:
    """Return the waiting requests in admission order (stable: ties keep arrival order)."""
    if policy == "fcfs" or len(waiting) > LPM_MAX_QUEUE:
        return list(waiting)
    if policy != "lpm":
        raise ValueError(f"unknown schedule policy {policy!r}")
    matched = {id(r): kv.cached_prefix_len(r.all_ids, r.prefix) for r in waiting}
    return sorted(waiting, key=lambda r: -matched[id(r)])


class AdmittedInStep:
    """The requests admitted in this step (and those still prefilling), for defer_for_shared_prefix.

    For each cached length c that a candidate brings, the requests are indexed by their tokens at c
    and c + SHARED_PREFIX_MIN_TOKENS - 1 (built at the first candidate with that c, then kept up to
    date by `append`), so a candidate is compared in full only with requests that agree on both: many
    candidates behind one cached prefix cost O(1) each instead of a scan of every admitted request.
    Their token lists must not change during the step (outputs are appended after admission); an
    output still in flight is not a known token, so it never counts as shared.
    """

    def __init__(self, reqs: Sequence[Req]) -> None:
        self.reqs = list(reqs)
        self._index: dict[int, dict[tuple[int, int], list[Req]]] = {}  # cached length -> probes -> reqs

    def append(self, req: Req) -> None:
        self.reqs.append(req)
        for cached_len, index in self._index.items():
            self._add(index, cached_len, req)

    def matching(self, cached_len: int, first_new: int, last: int) -> list[Req]:
        """Requests with at least cached_len + SHARED_PREFIX_MIN_TOKENS tokens whose tokens at
        cached_len and cached_len + SHARED_PREFIX_MIN_TOKENS - 1 are first_new and last."""
        index = self._index.get(cached_len)
        if index is None:
            index = self._index[cached_len] = {}
            for req in self.reqs:
                self._add(index, cached_len, req)
        return index.get((first_new, last), [])

    @staticmethod
    def _add(index: dict[tuple[int, int], list[Req]], cached_len: int, req: Req) -> None:
        ids = req.all_ids
        n = cached_len + SHARED_PREFIX_MIN_TOKENS
        if len(ids) - req.num_in_flight >= n:  # known tokens only
            index.setdefault((ids[cached_len], ids[n - 1]), []).append(req)


def defer_for_shared_prefix(candidate: Req, cached_len: int, admitted: AdmittedInStep) -> bool:
    """True if `candidate` shares an uncached prefix (>= SHARED_PREFIX_MIN_TOKENS beyond what is
    cached) with a request admitted in this step: it should wait and reuse that request's KV."""
    n = cached_len + SHARED_PREFIX_MIN_TOKENS
    ids = candidate.all_ids
    if len(ids) < n:
        return False
    # two cheap probes (the index) before the full compare: with many requests sharing a cached
    # prefix, the first uncached token already tells them apart
    others = admitted.matching(cached_len, ids[cached_len], ids[n - 1])
    return any(other.all_ids[:n] == ids[:n] for other in others)
