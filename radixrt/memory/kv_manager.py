"""The KV manager: the scheduler's one entry point to KV memory, and a request's page table.

KVManager composes the PageAllocator (who holds which page) and the RadixCache (which prefixes are
cached) and implements the request lifecycle: admit (reuse the cached prefix, copy-on-write a shared
partial page), reserve (pages for new tokens), publish (cache_unfinished_req / cache_finished_req)
and release (abort / retract), plus what scheduling asks of memory: a cached-prefix probe for lpm
ordering, pages needed, pool size, flush, the invariant check. The scheduler sees only the types of
this module: the allocator and the tree stay private, and a waiting request's fast-path state for
the tree (its last match, its prompt as bytes) is an opaque `PrefixHandle` (as vLLM's KVCacheBlocks
hides the block pool). Design: RadixAttention (Zheng et al., SGLang, 2023) for reuse and
publication, PagedAttention (Kwon et al., SOSP 2023) for reference-counted pages and copy-on-write.

Index ranges of one request over its positions (P = page_size, here 4; "|" = page boundary):

    positions        0   1   2 | 3   4   5   6 | 7   8   9
    at admit         [ cached_len = 3  ]                       matched in the tree, pages shared
                     page 0 is partial: copied (COW) into a fresh page owned by the request
    reserve(10)                  [ new tokens: slots returned    ]   kv_len = 10
    cache_unfinished [ published: floor(10 / P) * P = 8 tokens  ]   inserted; the tree refs pages 0, 1
                                                     [ 8   9 ]  partial page 2 stays exclusive
    cache_finished   [ published: all 10 tokens, page 2 included               ]
                     then the request drops its refs on pages 0..2 (the tree keeps its own)

Invariant kept for every live ReqKV: a page that the request will still write into (the one holding
position kv_len when kv_len % P != 0) has reference count 1. Pages are append-only: once admit
returns, kv.pages[i] never changes, so a device copy of the page table can be updated incrementally.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from radixrt.memory.host_tier import CopyOp, HostTier
from radixrt.memory.invariants import check_host_invariants
from radixrt.memory.page_allocator import PageAllocator
from radixrt.memory.radix_cache import MatchHint, RadixCache, TreeNode

LOAD_AHEAD_FRACTION = 0.25  # of the device pool: at most this many pages pinned by waiting loads


@dataclass(slots=True)
class ReqKV:
    """KV state of one request. Owned by the scheduler's Req; mutated only through KVManager.

    Slots derived from pages are valid only while the ReqKV holds its references (until release /
    cache_finished_req).
    """

    pages: list[int] = field(default_factory=list)  # page table; one reference held on each entry
    kv_len: int = 0  # tokens whose KV is written (or being written this step) in pages
    cached_len: int = 0  # tokens taken from the tree at admission (usage.cached_tokens)
    last_node: TreeNode | None = None  # node this request holds one lock_ref on (root if no match)
    published_len: int = 0  # tokens of this request present in the tree along last_node's path
    # host tier: the handle whose load pin (PrefixHandle) still protects this request's prefix until
    # its first reserve (the request then runs, and its own lock protects it)
    pin_handle: PrefixHandle | None = field(default=None, repr=False)

    @property
    def active(self) -> bool:
        """Whether the request still holds pages / a lock (False after release or finish)."""
        return self.last_node is not None


@dataclass(slots=True, eq=False)
class LoadPin:
    """A waiting request's load from the host tier: one lock on the loaded chain's last node, held
    from the order until the request runs (its first reserve), so that eviction cannot take the
    loaded pages back in between; `done` once the worker reported the copy. num_pages: pages loaded."""

    node: TreeNode
    copy_id: int
    num_pages: int
    done: bool = False


@dataclass(slots=True, eq=False)
class PrefixHandle:
    """A request's fast-path state for prefix matches, opaque outside this module: the tree's last
    match of its tokens (so an unchanged match costs a walk up the matched path, not a compare of
    its tokens; RadixCache.match_prefix's `hint`) and its prompt as int64 bytes (one memcmp per
    node instead of a compare per token). Made by `KVManager.prefix_handle`, used by
    `cached_prefix_len` and `admit`, valid for the request's lifetime (its prompt never changes)."""

    _hint: MatchHint
    _token_bytes: bytes
    _namespace: int | None = None  # RadixCache.namespace_root key of the request's cache_salt
    _load: LoadPin | None = None  # host tier: its load (in flight or done), until it runs

    @property
    def last_prefix_len(self) -> int:
        """Cached prefix length found by the last probe or admission (0 before the first)."""
        return self._hint.prefix_len


class KVManager:
    """The scheduler's single entry point to KV memory. Not thread-safe; the scheduler owns it.

    Every method either succeeds completely or returns None leaving the request's state unchanged
    (a failed admit/reserve may still have split tree nodes, which changes no accounting). The
    allocator and the cache are the manager's: after construction nothing else may touch them.
    """

    def __init__(self, allocator: PageAllocator, cache: RadixCache, page_size: int) -> None:
        if cache.allocator is not allocator or cache.page_size != page_size:
            raise ValueError("cache must be built over this allocator with this page_size")
        self._allocator = allocator
        self._cache = cache
        self.page_size = page_size
        self._tier: HostTier | None = cache.tier
        self._pins: dict[int, PrefixHandle] = {}  # copy id -> handle holding its pin, oldest first
        self._pinned_pages = 0  # device pages of the loads in _pins
        self.num_unpinned_load_pages = 0  # loaded pages whose pin went before their request ran

    @classmethod
    def create(cls, num_pages: int, page_size: int, disable_radix_cache: bool = False, *,
               num_host_pages: int = 0, write_policy: str = "write_through") -> KVManager:
        """A manager over a fresh pool of num_pages pages (page 0 reserved) and an empty tree;
        num_host_pages > 0 (and the radix cache on) adds a host tier of that many pages."""
        allocator = PageAllocator(num_pages)
        cache = RadixCache(allocator, page_size, disable=disable_radix_cache)
        if num_host_pages > 0 and not disable_radix_cache:
            HostTier(cache, num_host_pages, write_policy)
        return cls(allocator, cache, page_size)

    def prefix_handle(self, prompt_ids: np.ndarray, cache_salt: str | None = None) -> PrefixHandle:
        """The handle of a new request whose prompt is prompt_ids ([prompt_len] int64).

        cache_salt (vLLM's name): the request's tenant. A salted request matches and publishes only
        in its salt's namespace of the tree (RadixCache.namespace_root), so requests of different
        salts, or a salted and an unsalted one, never share KV; None is the shared namespace. The
        salt maps to its namespace by a keyed 63-bit hash (key random per process), so neither a
        table grows with the number of salts nor can a client aim at another tenant's namespace.
        """
        ns = None
        if cache_salt is not None and not self._cache.disable:
            digest = hashlib.blake2b(cache_salt.encode(), digest_size=8, key=_SALT_KEY).digest()
            ns = -1 - (int.from_bytes(digest, "little") >> 1)
        return PrefixHandle(MatchHint(), np.ascontiguousarray(prompt_ids, np.int64).tobytes(), ns)

    def _root(self, handle: PrefixHandle | None) -> TreeNode | None:
        """The namespace root to match under (None: the shared root)."""
        if handle is None or handle._namespace is None:
            return None
        return self._cache.namespace_root(handle._namespace)

    def cached_prefix_len(self, token_ids: Sequence[int], handle: PrefixHandle | None = None) -> int:
        """How many of token_ids[:-1] admit would take from the cache now or after a load from the
        host tier (the lpm probe): no references, no hit-rate statistics; refreshes the matched
        path's LRU time like a match."""
        m = self._cache.match_prefix(token_ids, end=len(token_ids) - 1, hint=_hint(handle),
                                     token_bytes=_bytes(handle), root=self._root(handle))
        return m.host_prefix_len

    # ---------------------------------------------------------------- admission / growth
    def admit(
        self, token_ids: Sequence[int], max_new_tokens_reserve: int = 0, *,
        handle: PrefixHandle | None = None,
    ) -> tuple[ReqKV, list[tuple[int, int]]] | None:
        """Start a request: reuse the cached prefix of token_ids[:-1] and lock it.

        The last prompt token is always computed (its logits are needed), so at most len - 1 tokens
        come from the cache. If the prefix ends inside a page, that page is shared with the tree: a
        fresh page is allocated and (src, dst) is returned in the COW list; the worker must copy page
        src to dst before any KV write of the batch it ships with. Pages for the tokens to compute are
        not allocated (see reserve), but admission requires free + evictable pages to cover positions
        [0, len(token_ids) + max_new_tokens_reserve) beyond what the request already holds; otherwise
        None is returned and nothing is held or evicted. Raises ValueError on an empty prompt.
        handle: the request's PrefixHandle, if it has one (same result, faster).
        """
        if len(token_ids) == 0:
            raise ValueError("cannot admit an empty prompt")
        cache, ps = self._cache, self.page_size
        match = cache.match_prefix(token_ids, end=len(token_ids) - 1, record_stats=True, hint=_hint(handle),
                                   token_bytes=_bytes(handle), root=self._root(handle))
        prefix_len, pages = match.prefix_len, list(match.pages)
        cache.inc_lock_ref(match.last_node)  # before any eviction below can touch the match
        self._allocator.inc_ref(pages)
        needs_cow = prefix_len % ps != 0
        num_needed = needs_cow + self._num_pages_for(len(token_ids) + max_new_tokens_reserve) - len(pages)
        if num_needed > self.num_available_pages() and self._pins and self._only_pins_run():
            self._unpin(num_needed - self.num_available_pages(), keep=handle)  # else nothing could
        if num_needed > self.num_available_pages():
            self._allocator.dec_ref(pages)
            cache.dec_lock_ref(match.last_node)
            return None
        cow: list[tuple[int, int]] = []
        if needs_cow:
            dst = self._alloc(1)
            if dst is None:  # see _alloc: the count above can include pages eviction cannot free now
                self._allocator.dec_ref(pages)
                cache.dec_lock_ref(match.last_node)
                return None
            cow.append((pages[-1], dst[0]))
            self._allocator.dec_ref(pages[-1:])  # src stays alive: held by the locked path
            pages[-1] = dst[0]
        if self._tier is not None:
            self._tier.on_hit(match.last_node)
        kv = ReqKV(pages=pages, kv_len=prefix_len, cached_len=prefix_len, last_node=match.last_node,
                   published_len=prefix_len)
        if handle is not None and handle._load is not None:
            kv.pin_handle = handle  # the pin protects the prefix until the request runs (reserve)
        return kv, cow

    # ---------------------------------------------------------------- host tier
    def prepare_load(self, token_ids: Sequence[int], handle: PrefixHandle | None = None) -> bool:
        """Whether a waiting request may be admitted now, or must wait for its KV to come back from
        the host tier. Always True without a host tier.

        When the match of token_ids[:-1] goes on past the device into host-only nodes, this pins the
        match (a lock, LoadPin), allocates device pages for those nodes (evicting), orders their
        load (see take_copy_ops) and returns False; calls while the load is in flight return False,
        and True once it is done (copies_done). The pin stays until the request runs (its first
        `reserve` after `admit`), is aborted (release_handle), or the pages are needed by running
        requests or by an admission that nothing else could make room for (`_unpin`): so a load is
        not evicted again before the request that waited for it was admitted.
        False, ordering nothing, while another request's load of the same nodes is in flight (it
        then finds them on the device), and while the loads pinned for waiting requests hold
        LOAD_AHEAD_FRACTION of the pool (loads are ordered in admission order, not all at once).
        True, ordering nothing, when the device cannot hold the load and the rest of the prompt (or
        handle is None: nowhere to keep the load): admit takes the device part, the rest is recomputed.
        """
        tier, cache = self._tier, self._cache
        if tier is None:
            return True
        if handle is not None and handle._load is not None:
            return handle._load.done
        m = cache.match_prefix(token_ids, end=len(token_ids) - 1, hint=_hint(handle),
                               token_bytes=_bytes(handle), root=self._root(handle))
        node = m.host_last_node
        if node is None or node is m.last_node or handle is None:
            return True
        chain: list[TreeNode] = []
        cur: TreeNode | None = node
        while cur is not None and cur is not m.last_node:
            chain.append(cur)
            cur = cur.parent
        if any(n.pages for n in chain):  # loading (another request's load), or below such a node
            return False
        chain.reverse()
        num = sum(len(n.host_pages) for n in chain)
        cap = LOAD_AHEAD_FRACTION * self._allocator.num_total_pages
        if self._pinned_pages and self._pinned_pages + num > cap:
            return False
        cache.inc_lock_ref(node)
        rest = self._num_pages_for(len(token_ids)) - node.end // self.page_size
        copy_id = None if num + rest > self.num_available_pages() else tier.load(chain)
        if copy_id is None:
            cache.dec_lock_ref(node)
            return True
        tier.num_host_hit_tokens += node.end - m.prefix_len
        handle._load = LoadPin(node, copy_id, num)
        self._pins[copy_id] = handle
        self._pinned_pages += num
        return False

    def release_handle(self, handle: PrefixHandle | None) -> None:
        """Drop what a waiting request's handle holds (the pin of its load): at abort or finish
        (admission drops it itself). A load in flight runs to its end. No-op when it holds nothing."""
        if handle is not None and handle._load is not None:
            pin = handle._load
            self._cache.dec_lock_ref(pin.node)
            del self._pins[pin.copy_id]
            self._pinned_pages -= pin.num_pages
            handle._load = None

    def _unpin(self, num_pages: int, keep: PrefixHandle | None) -> None:
        """Drop the pins of finished loads (but keep's), oldest first, until num_pages more pages
        are available or none is left; those requests load again if eviction takes the pages."""
        target = self.num_available_pages() + num_pages
        for handle in list(self._pins.values()):
            if self.num_available_pages() >= target:
                return
            pin = handle._load
            if handle is not keep and pin is not None and pin.done:
                self.num_unpinned_load_pages += pin.num_pages
                self.release_handle(handle)

    def _only_pins_run(self) -> bool:
        """Whether the only locks besides one of the caller's are load pins (no request runs)."""
        return self._cache.root.lock_ref <= 1 + len(self._pins)

    def take_copy_ops(self) -> list[CopyOp]:
        """Host-tier copies ordered since the last call, for the next ForwardBatch ([] without a
        host tier). The worker runs loads and store_before copies before that pass, store_after
        copies after it, and reports each id back done (copies_done)."""
        return [] if self._tier is None else self._tier.take_ops()

    def copies_done(self, copy_ids: Iterable[int]) -> None:
        """The worker finished these copies (ForwardResult.copies_done)."""
        if self._tier is not None:
            ids = list(copy_ids)
            self._tier.complete(ids)
            for copy_id in ids:
                handle = self._pins.get(copy_id)
                if handle is not None and handle._load is not None:
                    handle._load.done = True

    @property
    def has_copies(self) -> bool:
        """Host-tier copies ordered or in flight."""
        return self._tier is not None and self._tier.has_copies

    @property
    def host_tier_enabled(self) -> bool:
        return self._tier is not None

    def reserve(self, kv: ReqKV, new_kv_len: int) -> list[int] | None:
        """Grow kv to cover positions [0, new_kv_len); return the slots of [kv.kv_len, new_kv_len).

        Allocates the missing pages, evicting LRU unlocked leaves if needed, and sets kv.kv_len =
        new_kv_len. The returned slots (page * page_size + offset, the out_cache_loc of the new tokens)
        are valid while kv holds its refs. Returns None, changing nothing, if memory is short even
        after evicting. Raises ValueError if new_kv_len < kv.kv_len or kv is not active.
        """
        if kv.last_node is None:
            self._check_active(kv)
        start, ps, pages = kv.kv_len, self.page_size, kv.pages
        if new_kv_len < start:
            raise ValueError(f"cannot shrink kv_len {start} to {new_kv_len}")
        if start % ps and self._allocator.refcount(pages[start // ps]) != 1:
            raise RuntimeError("copy-on-write violated: the partial page to write is shared")
        num_new = (new_kv_len + ps - 1) // ps - len(pages)
        if num_new > 0:
            if num_new > self.num_available_pages() and self._pins:
                self._unpin(num_new - self.num_available_pages(), keep=kv.pin_handle)  # running first
            if num_new > self.num_available_pages():
                return None
            new_pages = self._alloc(num_new)
            if new_pages is None:  # see _alloc: the availability count can exceed what eviction frees
                return None
            pages.extend(new_pages)
        if new_kv_len - start == 1:  # a decode step: one slot, no list building
            slots = [pages[start // ps] * ps + start % ps]
        else:
            slots = self.slots(kv, start, new_kv_len)
        kv.kv_len = new_kv_len
        if kv.pin_handle is not None:  # admitted and running: its own lock protects the prefix
            self.release_handle(kv.pin_handle)
            kv.pin_handle = None
        return slots

    # ---------------------------------------------------------------- publication / end
    def cache_unfinished_req(self, kv: ReqKV, token_ids: Sequence[int]) -> None:
        """Publish the page-aligned prefix of a running request and move its lock there.

        token_ids: the request's tokens, at least kv.kv_len of them: the first kv_len have their KV
        written, later ones (not computed yet) are ignored. Only floor(kv_len / page_size) pages are
        published, so the partial last page stays the request's alone and can still be written. The
        request keeps its own pages even where another request published the same tokens first (its
        page table is append-only). Costs nothing when no new whole page is there to publish.
        """
        self._check_active(kv)
        if len(token_ids) < kv.kv_len:
            raise ValueError(f"{len(token_ids)} tokens given, kv_len is {kv.kv_len}")
        aligned = kv.kv_len // self.page_size * self.page_size
        if self._cache.disable or aligned <= kv.published_len:
            return
        # the walk starts at the locked node: its path holds token_ids[:kv.published_len]
        node = self._cache.insert_path(token_ids, kv.pages, start=kv.last_node, end=aligned)
        assert node.end == aligned, "just inserted prefix not found"
        old = kv.last_node
        assert old is not None
        self._cache.inc_lock_ref(node)
        self._cache.dec_lock_ref(old)
        kv.last_node, kv.published_len = node, aligned

    def cache_finished_req(self, kv: ReqKV, token_ids: Sequence[int], end: int | None = None) -> None:
        """Publish token_ids[:end] (end None: all; the tokens whose KV is written, partial last page
        included), then drop the request's lock and page references. Also the way to retract a
        request: it resumes from the cache when admitted again. Afterwards kv holds nothing.

        The tokens published, len(token_ids[:end]), must not exceed kv.kv_len; `end` (>= 0, cut to
        len(token_ids) as by a slice) saves the caller a copy of the list.
        """
        self._check_active(kv)
        n = len(token_ids) if end is None else min(end, len(token_ids))
        if not 0 <= n <= kv.kv_len:
            raise ValueError(f"{n} tokens given, only {kv.kv_len} have KV")
        assert kv.last_node is not None
        # the walk starts at the locked node (see cache_unfinished_req); in a namespace, tokens that
        # end before it are on its path already, and the root walk insert would fall back to is
        # the shared namespace's
        if kv.last_node.end <= n or _in_shared(kv.last_node):
            self._cache.insert(token_ids, kv.pages, start=kv.last_node, end=n)
        self.release(kv)

    def release(self, kv: ReqKV) -> None:
        """Abort / retract without publishing: unlock and drop the request's page refs.

        The tree holds its own refs on whatever was published, so it never points at freed pages.
        Releasing an inactive kv is a no-op.
        """
        if kv.last_node is None:
            return
        kv.pin_handle = None  # a pin is the waiting request's (release_handle)
        self._cache.dec_lock_ref(kv.last_node)
        self._allocator.dec_ref(kv.pages)
        kv.pages = []
        kv.kv_len = kv.published_len = 0
        kv.last_node = None

    # ---------------------------------------------------------------- queries
    def num_available_pages(self) -> int:
        """Free pages plus pages that eviction could free."""
        return self._allocator.num_free_pages() + self._cache.evictable_size()

    def num_pages_needed(self, kv: ReqKV, new_kv_len: int) -> int:
        """Pages reserve(kv, new_kv_len) would have to allocate (<= 0: none)."""
        return self._num_pages_for(new_kv_len) - len(kv.pages)

    @property
    def pool_tokens(self) -> int:
        """Tokens the whole pool can hold (page 0 is reserved)."""
        return (self._allocator.num_pages - 1) * self.page_size

    def flush(self) -> None:
        """Empty the radix tree (every page it holds goes back to the free list). The caller
        guarantees that no request holds KV (nothing running or admitted). Raises RuntimeError
        while host-tier copies are in flight."""
        if self.has_copies:
            raise RuntimeError("cannot flush the radix cache while host-tier copies are in flight")
        for handle in list(self._pins.values()):
            self.release_handle(handle)
        self._cache.reset()

    def check_invariants(self, kvs: Iterable[ReqKV]) -> None:
        """Check the KV invariant (radixrt/memory/invariants.py) from scratch, given every live
        request's ReqKV. Raises AssertionError naming the first violation. With a host tier the
        copies in flight count as holders too, and the host tier is checked as well."""
        refs = self.external_refs(kvs)
        if self._tier is None:
            self._cache.check_invariants(refs)
            return
        dev_refs, host_refs = self._tier.op_refs()
        for page, c in dev_refs.items():
            refs[page] = refs.get(page, 0) + c
        self._cache.check_invariants(refs)
        check_host_invariants(self._tier, host_refs)

    def slots(self, kv: ReqKV, start: int, end: int) -> list[int]:
        """Slots (page * page_size + offset) of positions [start, end) of kv; end <= covered length."""
        ps, pages = self.page_size, kv.pages
        if end > len(pages) * ps:
            raise ValueError(f"positions up to {end} not covered by {len(pages)} pages")
        if end - start == 1:  # decode
            return [pages[start // ps] * ps + start % ps]
        out: list[int] = []
        for i in range(start // ps, (end - 1) // ps + 1):  # one run of consecutive slots per page
            base = i * ps
            slot0 = pages[i] * ps - base
            out.extend(range(slot0 + max(start, base), slot0 + min(end, base + ps)))
        return out

    @staticmethod
    def external_refs(kvs: Iterable[ReqKV]) -> dict[int, int]:
        """page -> references held by these requests (for check_invariants)."""
        counts: Counter[int] = Counter()
        for kv in kvs:
            counts.update(kv.pages)
        return dict(counts)

    def stats(self) -> dict[str, float]:
        """Page accounting and prefix hit rate, for /metrics and /get_server_info."""
        cache = self._cache
        return {
            "num_total_pages": self._allocator.num_total_pages,
            "num_free_pages": self._allocator.num_free_pages(),
            "num_evictable_pages": cache.evictable_size(),
            "num_protected_pages": cache.protected_size(),
            "total_queried_tokens": cache.total_queried_tokens,
            "total_matched_tokens": cache.total_matched_tokens,
            "hit_rate": cache.hit_rate(),
            **({} if self._tier is None else self._tier_stats()),
        }

    def _tier_stats(self) -> dict[str, float]:
        assert self._tier is not None
        return {**self._tier.stats(), "hicache_pinned_load_pages": self._pinned_pages,
                "hicache_unpinned_load_pages": self.num_unpinned_load_pages}

    # ---------------------------------------------------------------- helpers
    def _num_pages_for(self, num_tokens: int) -> int:
        return (num_tokens + self.page_size - 1) // self.page_size

    def _alloc(self, n: int) -> list[int] | None:
        """Allocate n pages, evicting LRU unlocked leaves first if the free list is short; None when
        eviction freed too few. With a host tier, `num_available_pages` can count more than eviction
        frees at once: a write_back eviction's store-before copy, and a load in flight, hold their
        device pages until the copy completes (found by tests/memory/test_hicache_property.py)."""
        shortfall = n - self._allocator.num_free_pages()
        if shortfall > 0:
            self._cache.evict(shortfall)
        return self._allocator.alloc(n)

    @staticmethod
    def _check_active(kv: ReqKV) -> None:
        if kv.last_node is None:
            raise ValueError("request holds no KV (already finished or released)")


_SALT_KEY = secrets.token_bytes(16)  # keys the cache_salt -> namespace hash (prefix_handle)


def _in_shared(node: TreeNode) -> bool:
    """Whether node lies in the shared namespace (no namespace root on its path)."""
    while node.parent is not None:
        if node.start < 0:
            return False
        node = node.parent
    return True


def _hint(handle: PrefixHandle | None) -> MatchHint | None:
    return None if handle is None else handle._hint


def _bytes(handle: PrefixHandle | None) -> bytes | None:
    return None if handle is None else handle._token_bytes
